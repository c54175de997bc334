"""Task status notifications: ``notifications/tasks`` on a ``subscriptions/listen`` stream
(the tasks extension's way to push, 2026-07-28).

A client lists the task ids it follows (``notifications.taskIds``); the server honors
those of its parent session (another session's, or an unknown id, is left out of the
acknowledgement, so its existence is not leaked), then sends one ``notifications/tasks``
per status change it observes, with the full ``DetailedTask`` (the result once settled),
and ends the stream gracefully once every followed task has settled.

Statuses are read from the Task rows: a Task of this runtime is seen settling at once
(its ``on_done``), one of another runtime on the store within `RECHECK_S`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, cast

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from controlplane.aio import AsyncSubagentControl
from controlplane.contract import AgentHandle, SubagentControlError, TaskSnapshot
from controlplane.fronts._mcp_tasks import TASKS_EXTENSION, detailed_task, wants_tasks

__all__ = ["MAX_FOLLOWED", "RECHECK_S", "TaskListener"]

RECHECK_S: Final = 1.0
"""How often a followed Task of another runtime is read again from the store."""

MAX_FOLLOWED: Final = 100
"""The most task ids one stream follows."""

_MISSING_CAPABILITY: Final = -32021


class _TaskNotification(types.Notification[dict[str, Any], Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


class TaskListener:
    """The ``subscriptions/listen`` handler of the MCP front.

    Args:
        aio: The control plane, awaited.
        parent: The session whose tasks may be followed.
        output_text: The ``task_output`` text of a settled Task.
    """

    def __init__(
        self,
        aio: AsyncSubagentControl,
        parent: AgentHandle,
        output_text: Callable[[TaskSnapshot], Awaitable[str]],
    ) -> None:
        self._aio = aio
        self._parent = parent
        self._output_text = output_text

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """Serve one stream: acknowledge, notify each status change, end when all settled."""
        if ctx.request_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        requested = _task_ids(params.notifications)
        if requested and not wants_tasks(ctx.meta):
            raise MCPError(
                _MISSING_CAPABILITY,
                "Missing required client capability",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        followed = [s for s in [await self._snapshot(i) for i in requested] if s is not None]
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        # Only what is honored is acknowledged: no other kind of event is ever sent here.
        honored = types.SubscriptionFilter.model_validate(
            {"taskIds": [snapshot.id for snapshot in followed]}
        )
        ack = types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(
                notifications=honored, _meta=meta
            )
        )
        await ctx.session.send_notification(ack, related_request_id=ctx.request_id)
        async with anyio.create_task_group() as group:
            for snapshot in followed:
                group.start_soon(self._follow, ctx, snapshot, meta)
        return types.SubscriptionsListenResult(_meta=meta)

    async def _follow(
        self, ctx: ServerRequestContext[Any, Any], snapshot: TaskSnapshot, meta: dict[str, Any]
    ) -> None:
        told: str | None = None
        while True:
            status = snapshot.status.value
            if status != told:
                told = status
                terminal = snapshot.status.is_terminal
                output = await self._output_text(snapshot) if terminal else None
                note = _TaskNotification(params={**detailed_task(snapshot, output), "_meta": meta})
                await ctx.session.send_notification(
                    cast(types.ServerNotification, note), related_request_id=ctx.request_id
                )
            if snapshot.status.is_terminal:
                return
            snapshot = await self._aio.wait_or_snapshot(
                snapshot.id, RECHECK_S, requester=self._parent
            )

    async def _snapshot(self, task_id: str) -> TaskSnapshot | None:
        try:
            return await self._aio.get(task_id, requester=self._parent)
        except SubagentControlError:
            return None  # not this session's: not honored, and not said why


def _task_ids(requested: types.SubscriptionFilter) -> list[str]:
    raw = (requested.model_extra or {}).get("taskIds")
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(i, str) and 0 < len(i) <= 200 for i in raw):
        raise MCPError(types.INVALID_PARAMS, "notifications.taskIds must be a list of task ids")
    unique = list(dict.fromkeys(raw))
    if len(unique) > MAX_FOLLOWED:
        raise MCPError(types.INVALID_PARAMS, f"follow at most {MAX_FOLLOWED} tasks on one stream")
    return unique
