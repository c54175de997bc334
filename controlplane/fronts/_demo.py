"""``--demo``: a built-in provider, so trying a front (or the CLI's ``send``) takes one
command and no model server.

`DemoModel` is a scripted stand-in for a model, deterministic and per conversation: to
each new message it answers by calling its one tool, ``word_count``, on the message, then
says what the tool found and how many messages it has read. Each call takes a moment
(``think_s``, ended at once by a kill), so a follow-up sent meanwhile steers the running
turn, as it would with a real model.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import CancelSignal
from controlplane.models import ModelReply, ModelRequest, ToolCall
from controlplane.providers import ChildTool, InProcessProvider

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["DEMO_PROVIDER", "DemoModel", "register_demo"]

DEMO_PROVIDER: Final = "demo"
"""The name the demo provider is registered under."""
_THINK_S: Final = 1.0


class DemoModel:
    """A scripted model that answers each message by calling ``word_count`` on it, then
    reporting the count (see the module docstring)."""

    def __init__(self, *, think_s: float = _THINK_S) -> None:
        self._think_s = think_s

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        signal.wait(self._think_s)  # "thinking": a kill ends it at once
        signal.raise_if_aborted()
        asked = [m for m in request.messages if m.role == "user"]
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user":
            call_id = f"count-{len(asked)}"
            arguments = json.dumps({"text": last.text})
            return ModelReply(
                tool_calls=[ToolCall(id=call_id, name="word_count", arguments=arguments)]
            )
        counted = last.text if last is not None and last.role == "tool" else "?"
        said = asked[-1].text if asked else ""
        return ModelReply(
            text=f"demo model: {said!r} has {counted} word(s); "
            f"{len(asked)} message(s) read in this conversation"
        )


def _word_count(arguments: dict[str, Any]) -> str:
    return str(len(str(arguments.get("text", "")).split()))


WORD_COUNT: Final = ChildTool(
    "word_count",
    "Count the words of a text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    _word_count,
    idempotent=True,
)


def register_demo(control: SubagentControl) -> None:
    """Register the demo provider (``demo``: `DemoModel` with the ``word_count`` tool)."""
    control.providers.register(
        InProcessProvider(DemoModel(), tools=[WORD_COUNT], name=DEMO_PROVIDER)
    )
