"""MCP tasks for clients of the MCP front (needs the ``mcp`` extra).

``Client(server, extensions=[TasksClient()])`` declares ``io.modelcontextprotocol/tasks``;
`get_task`, `cancel_task` and `task_result` follow a task from any connection, and
`follow_tasks` receives its status changes as ``notifications/tasks``.
"""

from __future__ import annotations

from controlplane.fronts import _require_mcp

_require_mcp("controlplane.fronts.mcp_tasks")

from controlplane.fronts._mcp_client import (  # noqa: E402 (after the extra's check)
    CreatedTask,
    DetailedTask,
    TaskNotice,
    TasksClient,
    cancel_task,
    follow_tasks,
    get_task,
    task_result,
)

__all__ = [
    "CreatedTask",
    "DetailedTask",
    "TaskNotice",
    "TasksClient",
    "cancel_task",
    "follow_tasks",
    "get_task",
    "task_result",
]
