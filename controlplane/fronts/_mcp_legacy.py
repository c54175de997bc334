"""MCP tasks as the 2025-11-25 specification had them in its core, for handshake-era
clients: the client declares ``capabilities.tasks`` at ``initialize`` and asks for a task
with ``params.task`` on ``tools/call``; the answer is ``{"task": {...}}``, and
``tasks/get`` (the task alone), ``tasks/result`` (the tool result) and ``tasks/cancel``
(the task, once cancelled) follow it.

The SDK (2.3) keeps these types but no longer serves them: the answer to a task-augmented
``tools/call`` is not a ``CallToolResult`` its result check admits, so `LegacyTaskCalls`
answers it as server middleware, before that check, through the same `ToolHandlers`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from controlplane.contract import TaskSnapshot
from controlplane.fronts._mcp_tasks import POLL_INTERVAL_MS, created_task_id, task_fields
from controlplane.tools import ToolHandlers

__all__ = ["RELATED_TASK", "LegacyTaskCalls", "is_legacy", "legacy_task", "tasks_capability"]

RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
"""The ``_meta`` key tying a ``tasks/result`` answer to its task (2025-11-25)."""


def is_legacy(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request came over a handshake-era connection (2025-11-25 or older)."""
    return ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS


def legacy_task(snapshot: TaskSnapshot) -> dict[str, Any]:
    """The 2025-11-25 wire ``Task`` (``ttl`` and ``pollInterval``, no inlined result)."""
    fields = task_fields(snapshot)
    task = {key: fields[key] for key in ("taskId", "status", "statusMessage", "createdAt")}
    task["lastUpdatedAt"] = fields["lastUpdatedAt"]
    task["ttl"] = None
    if not snapshot.status.is_terminal:
        task["pollInterval"] = POLL_INTERVAL_MS
    return task


def tasks_capability() -> types.ServerTasksCapability:
    """What the server says of tasks at ``initialize``: task-augmented ``tools/call`` and
    ``tasks/cancel`` (not ``tasks/list``: ``task_list`` is the tool for that)."""
    return types.ServerTasksCapability(
        cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(
            tools=types.TasksToolsCapability(call=types.TasksCallCapability())
        ),
    )


class LegacyTaskCalls:
    """Server middleware answering a task-augmented ``tools/call`` on a handshake-era
    connection whose client declared tasks; every other request passes through.

    Args:
        tools: The tool handlers the front answers with.
        snapshot: Our Task by id, under the front's parent session.
    """

    def __init__(
        self, tools: ToolHandlers, snapshot: Callable[[str], Awaitable[TaskSnapshot]]
    ) -> None:
        self._tools = tools
        self._snapshot = snapshot

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Answer with ``{"task": ...}`` when the call started an activation."""
        params = self._task_call(ctx)
        if params is None:
            return await call_next(ctx)
        result = await self._tools.acall(params.name, params.arguments or {})
        task_id = created_task_id(params.name, result.text, is_error=result.is_error)
        if task_id is None:
            # Nothing to follow (a steer, a refusal, another tool): the plain result.
            return {
                "content": [{"type": "text", "text": result.text}],
                "isError": result.is_error,
            }
        return {"task": legacy_task(await self._snapshot(task_id))}

    def _task_call(self, ctx: ServerRequestContext[Any, Any]) -> types.CallToolRequestParams | None:
        if ctx.method != "tools/call" or not is_legacy(ctx):
            return None
        raw = ctx.params
        if not isinstance(raw, Mapping) or raw.get("task") is None:
            return None
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.tasks is None:
            return None  # not declared (or not initialized yet): the ordinary path decides
        try:
            return types.CallToolRequestParams.model_validate(raw, by_name=False)
        except ValidationError:
            return None  # the ordinary path answers malformed params with its error
