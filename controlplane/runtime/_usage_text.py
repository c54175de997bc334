"""Usage as the model-facing and human-facing texts show it: one short clause."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.contract import Usage

__all__ = ["spend_clause", "usage_text"]


def usage_text(usage: Usage) -> str:
    """``12,345 tokens, 4 model calls, 2 tool calls, $0.0312``: the tool calls only when
    there were some, the cost only when a price was known (never a made-up $0)."""
    calls = usage.model_calls
    parts = [f"{usage.total_tokens:,} tokens", f"{calls} model call{'' if calls == 1 else 's'}"]
    if usage.tool_calls:
        tools = usage.tool_calls
        parts.append(f"{tools} tool call{'' if tools == 1 else 's'}")
    if usage.cost is not None:
        parts.append(f"${usage.cost:,.4f}")
    return ", ".join(parts)


def spend_clause(usage: Usage) -> str:
    """`` (spent …)`` for a Task's notice; empty when nothing was recorded."""
    if not usage.stored():
        return ""
    return f" (spent {usage_text(usage)})"
