"""The client side of MCP tasks (``io.modelcontextprotocol/tasks``), for SDK clients of
this front: the ``mcp`` SDK 2.3 ships the extension hooks, not the extension.

``Client(server, extensions=[TasksClient()])`` declares the extension on every request.
``client.call_tool`` then waits for a task handle transparently (polling ``tasks/get``);
``client.session.call_tool(..., allow_claimed=True)`` returns the `CreatedTask` itself,
and `get_task`, `cancel_task` and `task_result` follow it from any connection, to any
server process on the same store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import Field

from controlplane.fronts._mcp_tasks import POLL_INTERVAL_MS, TASKS_EXTENSION

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

_TERMINAL = frozenset({"completed", "failed", "cancelled"})


class _TaskFields(types.Result):
    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreatedTask(_TaskFields):
    """A task handle: what a ``tools/call`` returns when the server made it a task."""

    result_type: Literal["task"] = "task"


class DetailedTask(_TaskFields):
    """What ``tasks/get`` says: the task, and its result, error or input requests."""

    result_type: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the task has settled (completed, failed or cancelled)."""
        return self.status in _TERMINAL


class TaskNotice(types.NotificationParams):
    """A ``notifications/tasks`` notification: the task as ``tasks/get`` would read it."""

    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class _ListenRequest(types.Request[types.SubscriptionsListenRequestParams, str]):
    pass


class _TaskIdParams(types.RequestParams):
    task_id: str = Field(min_length=1)


class _TaskRequest(types.Request[_TaskIdParams, str]):
    name_param = "taskId"  # routed by task id (the extension's Mcp-Name header)


async def get_task(session: ClientSession, task_id: str) -> DetailedTask:
    """``tasks/get``."""
    request = _TaskRequest(method="tasks/get", params=_TaskIdParams(task_id=task_id))
    return await session.send_request(request, DetailedTask)


async def cancel_task(session: ClientSession, task_id: str) -> None:
    """``tasks/cancel``: acknowledged at once; the task reads ``cancelled`` once stopped."""
    request = _TaskRequest(method="tasks/cancel", params=_TaskIdParams(task_id=task_id))
    await session.send_request(request, types.EmptyResult)


async def task_result(session: ClientSession, task_id: str) -> types.CallToolResult:
    """``tasks/result``: waits for the task to settle and returns its tool result."""
    request = _TaskRequest(method="tasks/result", params=_TaskIdParams(task_id=task_id))
    return await session.send_request(request, types.CallToolResult)


async def follow_tasks(
    session: ClientSession, task_ids: list[str], *, timeout_s: float | None = None
) -> None:
    """Follow tasks on a ``subscriptions/listen`` stream until every one has settled.

    Each status change arrives as ``notifications/tasks``, handed to the ``on_status`` of
    this client's `TasksClient` (the server follows only its parent session's tasks).
    """
    request = _ListenRequest(
        method="subscriptions/listen",
        params=types.SubscriptionsListenRequestParams(
            notifications=types.SubscriptionFilter.model_validate({"taskIds": task_ids})
        ),
    )
    # Answered when the stream ends: every followed task has settled.
    await session.send_request(
        request, types.SubscriptionsListenResult, request_read_timeout_seconds=timeout_s
    )


class TasksClient(ClientExtension):
    """Declares the tasks extension; ``call_tool`` polls a task handle to its result.

    A task that ends ``failed`` raises `MCPError` with the server's error; ``cancelled``
    returns an error result.

    Args:
        on_status: Called with each ``notifications/tasks`` a `follow_tasks` stream brings.
    """

    identifier = TASKS_EXTENSION

    def __init__(self, on_status: Callable[[TaskNotice], Awaitable[None]] | None = None) -> None:
        self._on_status = on_status

    def notifications(self) -> list[NotificationBinding[Any]]:
        """``notifications/tasks``, to ``on_status``."""
        if self._on_status is None:
            return []
        return [
            NotificationBinding(
                method="notifications/tasks", params_type=TaskNotice, handler=self._on_status
            )
        ]

    def claims(self) -> list[ResultClaim[Any]]:
        """The ``resultType: "task"`` claim on ``tools/call``."""
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_poll)]


async def _poll(created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
    interval_ms = created.poll_interval_ms or POLL_INTERVAL_MS
    with anyio.fail_after(ctx.read_timeout_seconds):
        while True:
            task = await get_task(ctx.session, created.task_id)
            if task.status == "completed" and task.result is not None:
                return types.CallToolResult.model_validate(task.result, by_name=False)
            if task.status == "failed":
                error = task.error or {}
                raise MCPError(
                    code=int(error.get("code", types.INTERNAL_ERROR)),
                    message=str(error.get("message", "the task failed")),
                    data=error.get("data"),
                )
            if task.status == "cancelled":
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text="the task was cancelled")],
                    is_error=True,
                )
            await anyio.sleep((task.poll_interval_ms or interval_ms) / 1000)
