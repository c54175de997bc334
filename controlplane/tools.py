"""Tool-call handlers for a parent model: the eight tools (`subagent`, `send_message`,
`task_output`, `task_kill`, `task_list`, `list_agents`, `set_budget`, `answer`) as JSON-schema
definitions and handlers that never raise, and human input.

The public home of these names; they are implemented with the other fronts, in
`controlplane.fronts._tools`.
"""

from controlplane.fronts._tools import (
    INTERNAL_ERROR,
    MAX_MESSAGE_CHARS,
    HumanInput,
    ToolHandlers,
    ToolResult,
)

__all__ = [
    "INTERNAL_ERROR",
    "MAX_MESSAGE_CHARS",
    "HumanInput",
    "ToolHandlers",
    "ToolResult",
]
