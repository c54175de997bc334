"""The MCP server: the task tools, exactly as `ToolHandlers` defines and answers them, and
our Tasks as MCP tasks.

One source for the tools: names, descriptions and JSON schemas come from
``ToolHandlers.definitions()`` and every call goes through ``ToolHandlers.acall``, so a
tool added there (the approvals' ``answer``) is served here with nothing to change, and
the model-facing texts are the same as in any harness.

Tasks come in the two shapes MCP has had: the ``io.modelcontextprotocol/tasks`` extension
on 2026-07-28 connections (`controlplane.fronts._mcp_tasks`, pushes in `._mcp_listen`) and
the 2025-11-25 core's on handshake-era ones (`._mcp_legacy`); both read our Task rows.

Requires the optional ``mcp`` extra; `controlplane.fronts.mcp_front` says so when it is
missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import anyio
import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from controlplane.aio import AsyncSubagentControl
from controlplane.contract import AgentHandle, SubagentControlError, TaskSnapshot
from controlplane.fronts._mcp_ids import expand_ids
from controlplane.fronts._mcp_legacy import (
    RELATED_TASK,
    LegacyTaskCalls,
    is_legacy,
    legacy_task,
    tasks_capability,
)
from controlplane.fronts._mcp_listen import TaskListener
from controlplane.fronts._mcp_tasks import (
    TASKS_EXTENSION,
    created_task_id,
    detailed_task,
    task_fields,
    wants_tasks,
)
from controlplane.tools import ToolHandlers, ToolResult

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["SERVER_NAME", "McpFront", "TaskIdParams"]

SERVER_NAME: Final = "subagent-control"
_MAX_ID_CHARS: Final = 200
_RESULT_WAIT_S: Final = 600.0  # `tasks/result` blocks until settled, within a bound
_CANCEL_WAIT_S: Final = 10.0  # a 2025-11-25 `tasks/cancel` answers once the kill settled

_INSTRUCTIONS: Final = (
    "Delegate work to continuable background subagents: start one with `subagent`, follow "
    "it up with `send_message`, read its answer with `task_output`. Subagents keep their "
    "conversation across tasks and restarts."
)


class TaskIdParams(types.RequestParams):
    """The params of ``tasks/get``, ``tasks/result`` and ``tasks/cancel``."""

    task_id: str = Field(min_length=1, max_length=_MAX_ID_CHARS)


class _Server(Server[Any]):
    """The SDK's server, telling handshake-era clients it serves 2025-11-25 tasks."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        """The SDK's capabilities, plus ``tasks`` on a handshake-era connection."""
        capabilities = super().get_capabilities(
            notification_options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return capabilities
        return capabilities.model_copy(update={"tasks": tasks_capability()})


class McpFront:
    """An MCP server acting as one parent session of a control plane.

    Args:
        control: The open control plane.
        parent: The live parent session the server's clients act as.
        provider: The provider ``subagent`` starts children with.
    """

    def __init__(self, control: SubagentControl, parent: AgentHandle, *, provider: str) -> None:
        self._parent = parent
        self._control = control
        self._tools = ToolHandlers(control, parent, provider=provider)
        self._aio = AsyncSubagentControl(control)
        self.server: Server[Any] = _Server(
            SERVER_NAME,
            version=_version(),
            instructions=_INSTRUCTIONS,
            on_list_tools=self._list_tools,
        )
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.server.add_request_handler("tasks/get", TaskIdParams, self._tasks_get)
        self.server.add_request_handler("tasks/result", TaskIdParams, self._tasks_result)
        self.server.add_request_handler("tasks/cancel", TaskIdParams, self._tasks_cancel)
        self.server.add_request_handler(
            "subscriptions/listen",
            types.SubscriptionsListenRequestParams,
            TaskListener(self._aio, parent, self._output_text),
        )
        self.server.extensions[TASKS_EXTENSION] = {}
        self.server.middleware.append(LegacyTaskCalls(self._tools, self._snapshot))

    @property
    def tools(self) -> ToolHandlers:
        """The tool handlers the server answers with."""
        return self._tools

    # -- tools ------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name=definition["name"],
                description=definition["description"],
                input_schema=definition["parameters"],
            )
            for definition in self._tools.definitions()
        ]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        arguments = params.arguments or {}
        try:
            # Ids as the CLI takes them: a unique prefix of one of this session's ids.
            arguments = await anyio.to_thread.run_sync(
                expand_ids, self._control, self._parent, arguments
            )
        except SubagentControlError as exc:
            result = ToolResult.error(exc.code.value, exc.message)
        else:
            result = await self._tools.acall(params.name, arguments)
        task_id = created_task_id(params.name, result.text, is_error=result.is_error)
        if task_id is not None and _may_answer_with_a_task(ctx):
            # The Task row exists before `subagent` returns: a tasks/get from anywhere
            # resolves as soon as the client holds this id, as the extension requires.
            snapshot = await self._snapshot(task_id)
            return {**task_fields(snapshot), "resultType": "task"}
        return _tool_result(result.text, is_error=result.is_error)

    # -- tasks ------------------------------------------------------------------------

    async def _tasks_get(
        self, ctx: ServerRequestContext[Any], params: TaskIdParams
    ) -> HandlerResult:
        snapshot = await self._snapshot(params.task_id)
        if is_legacy(ctx):
            return legacy_task(snapshot)
        output = await self._output_text(snapshot) if snapshot.status.is_terminal else None
        return detailed_task(snapshot, output)

    async def _tasks_result(
        self, ctx: ServerRequestContext[Any], params: TaskIdParams
    ) -> HandlerResult:
        await self._snapshot(params.task_id)  # an unknown or foreign id is an error, not a result
        result = await self._tools.acall(
            "task_output", {"task_id": params.task_id, "wait": True, "timeout_s": _RESULT_WAIT_S}
        )
        answer = _tool_result(result.text, is_error=result.is_error)
        answer.meta = {RELATED_TASK: {"taskId": params.task_id}}
        return answer

    async def _tasks_cancel(
        self, ctx: ServerRequestContext[Any], params: TaskIdParams
    ) -> HandlerResult:
        snapshot = await self._snapshot(params.task_id)
        if snapshot.status.is_terminal and is_legacy(ctx):
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"task {snapshot.id} is already {snapshot.status.value}; nothing to cancel",
            )
        if not snapshot.status.is_terminal:
            try:
                await self._aio.kill(snapshot.id, requester=self._parent)
            except SubagentControlError as exc:
                raise _protocol_error(exc) from None
        if is_legacy(ctx):
            # 2025-11-25 answers with the task as cancellation left it (a kill settles fast).
            settled = await self._aio.wait_or_snapshot(
                snapshot.id, _CANCEL_WAIT_S, requester=self._parent
            )
            return legacy_task(settled)
        # The extension's cancellation is cooperative: acknowledged now, seen by tasks/get.
        return {}

    async def _snapshot(self, task_id: str) -> TaskSnapshot:
        try:
            return await self._aio.get(task_id, requester=self._parent)
        except SubagentControlError as exc:
            raise _protocol_error(exc) from None

    async def _output_text(self, snapshot: TaskSnapshot) -> str:
        result = await self._tools.acall("task_output", {"task_id": snapshot.id})
        return result.text


def _tool_result(text: str, *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error
    )


def _may_answer_with_a_task(ctx: ServerRequestContext[Any]) -> bool:
    # A handshake-era wire cannot carry the per-request capability back: never a handle there.
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and wants_tasks(ctx.meta)


def _protocol_error(exc: SubagentControlError) -> MCPError:
    # Our codes ride in `data`; the JSON-RPC code says the request named no task of ours.
    return MCPError(
        code=types.INVALID_PARAMS,
        message=f"error [{exc.code.value}]: {exc.message}",
        data={"code": exc.code.value},
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("subagent-control")
    except PackageNotFoundError:
        return "0"
