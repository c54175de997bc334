"""Model-facing tool handlers: JSON-schema definitions and handlers that never raise.

A harness shows the model `ToolHandlers.definitions()` and routes each tool call to
`ToolHandlers.call` (or ``await ToolHandlers.acall`` from an event loop). Every outcome is a
`ToolResult` the model can read: bad arguments, refused operations and even bugs come back
as ``error [<CODE>]: <message>`` with ``is_error`` set, and bad arguments change nothing.

Example:
    tools = ToolHandlers(control, parent)
    result = tools.call("subagent", {"description": "research X", "prompt": "..."})
    # ToolResult(text="started subagent <child_id> as task <task_id>", is_error=False)
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from pydantic import BaseModel

from controlplane.aio import AsyncSubagentControl
from controlplane.contract import (
    AgentHandle,
    Budget,
    ContinuableStartSpec,
    ErrorCode,
    MessageSource,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
    dumps,
)
from controlplane.fronts._human import HumanInput
from controlplane.fronts._toolargs import (
    MAX_MESSAGE_CHARS,
    TOOLS,
    AnswerArgs,
    ListAgentsArgs,
    SendMessageArgs,
    SetBudgetArgs,
    SubagentArgs,
    TaskKillArgs,
    TaskListArgs,
    TaskOutputArgs,
    parse_arguments,
)
from controlplane.runtime._usage_text import usage_text

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = [
    "INTERNAL_ERROR",
    "MAX_MESSAGE_CHARS",
    "HumanInput",
    "ToolHandlers",
    "ToolResult",
]

log = logging.getLogger(__name__)

_OWNED_CACHE: Final = 10_000
"""How many children confirmed as the parent's one `ToolHandlers` remembers (the least
recently steered go first; a forgotten one is read from the store again)."""

_ARGUMENTS_SHOWN: Final = 500
"""A waiting request's arguments beyond this many characters are clipped in its text."""

INTERNAL_ERROR: Final = ErrorCode.INTERNAL
"""The code of an unexpected failure inside a handler (a bug, not the model's arguments)."""

# What the model can do next, by code, for refusals from the control plane itself.
_HINTS: Final[dict[str, str]] = {
    ErrorCode.TASK_NOT_FOUND: "Check your task ids with task_list; do not retry this id.",
    ErrorCode.CHILD_NOT_FOUND: "Check your subagent ids with list_agents; do not retry this id.",
    ErrorCode.NOT_DELIVERED: (
        "The message was not delivered. Wait for the task to settle (task_output with "
        "wait=true), then send it again to start a new task."
    ),
    ErrorCode.OWNERSHIP_CONFLICT: "Another agent is driving this subagent; do not retry.",
    ErrorCode.UNAUTHORIZED: "This session may not do that; do not retry.",
    ErrorCode.NOT_RESUMABLE: "This subagent cannot be continued; do not retry it.",
    ErrorCode.DURABILITY_FAILED: (
        "The running subagent has the message, but it may be missing from its saved "
        "transcript; do not send it again."
    ),
    ErrorCode.CLOSED: "Subagents are shutting down; do not retry.",
    ErrorCode.UNKNOWN_PROVIDER: "Subagents are not available here; do not retry.",
    ErrorCode.NO_CONTROL_SURFACE: "Subagents are not available here; do not retry.",
    ErrorCode.PERSISTENCE_UNAVAILABLE: "Subagents are not available here; do not retry.",
    ErrorCode.STORE_UNAVAILABLE: "Storage is unavailable; retry later.",
    ErrorCode.BUDGET_EXHAUSTED: (
        "Nothing was sent. Raise its budget with set_budget first if it should go on."
    ),
    ErrorCode.REQUEST_NOT_FOUND: "Check the request id in task_output; do not retry this id.",
    ErrorCode.REQUEST_CLOSED: "It needs no answer now; do not retry.",
}


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call returns to the model.

    Attributes:
        text: The model-facing text.
        is_error: Whether the call failed (``text`` then reads ``error [<CODE>]: …``).
        code: The `ErrorCode` of a failed call, None on success.
    """

    text: str
    is_error: bool = False
    code: str | None = None

    @classmethod
    def error(cls, code: str, message: str) -> ToolResult:
        """An error result reading ``error [<code>]: <message>``."""
        return cls(text=f"error [{code}]: {message}", is_error=True, code=code)


class ToolHandlers:
    """The subagent tools, bound to one parent agent.

    Args:
        control: The control plane.
        parent: The live parent agent the model speaks for; it owns every child and Task
            these tools start, and sees only its own.
        provider: The provider name `subagent` starts children with.
        executor: Where `acall` runs blocking work; None uses the event loop's default.
    """

    def __init__(
        self,
        control: SubagentControl,
        parent: AgentHandle,
        *,
        provider: str = "inprocess",
        executor: Executor | None = None,
    ) -> None:
        if not isinstance(parent, AgentHandle):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"parent must be an AgentHandle, not {type(parent).__name__}",
            )
        self._control = control
        self._parent = parent
        self._provider = provider
        self._aio = AsyncSubagentControl(control, executor=executor)
        # Children confirmed as this parent's from their stored headers (see `_owns`).
        self._owned: OrderedDict[str, None] = OrderedDict()
        self._owned_lock = threading.Lock()

    @property
    def parent(self) -> AgentHandle:
        """The parent agent these tools act for."""
        return self._parent

    @property
    def provider(self) -> str:
        """The provider `subagent` starts children with."""
        return self._provider

    @staticmethod
    def definitions() -> list[dict[str, Any]]:
        """The tool definitions to show the model (fresh copies the caller may change).

        Returns:
            One ``{"name", "description", "parameters"}`` dict per tool; ``parameters`` is
            a JSON schema of an object with ``additionalProperties: false``.
        """
        return [spec.definition() for spec in TOOLS.values()]

    def call(self, name: str, arguments: object) -> ToolResult:
        """Run one tool call, blocking until it is answered; never raises.

        Args:
            name: The tool name.
            arguments: The arguments: a mapping, or the JSON text of an object.
        """
        return self._handle(name, arguments, defer_wait=False)

    async def acall(self, name: str, arguments: object) -> ToolResult:
        """Run one tool call without blocking the event loop; never raises (but is cancellable).

        The call runs in a worker thread. Cancelling the awaiting coroutine abandons the
        answer, not the operation: once handed to the worker, a start starts and a message
        is delivered (or refused) as a whole, and ``task_list`` shows the Task it made.
        """
        try:
            outcome = await self._aio.run_blocking(self._handle, name, arguments, defer_wait=True)
            if isinstance(outcome, ToolResult):
                return outcome
            # Waiting holds no worker thread: a slow subagent must not starve the pool.
            snapshot = await self._aio.wait_or_snapshot(
                outcome.task_id, outcome.timeout_s, requester=self._parent
            )
            return _output_result(snapshot)
        except SubagentControlError as exc:
            return _refused(exc)
        except Exception as exc:
            return self._internal(name, exc)

    def drain_notices(self) -> list[str]:
        """Take this parent's pending completion notices, one line per settled Task.

        A harness puts these in front of the model on its next turn, so it learns a
        background subagent finished without polling ``task_output``.
        """
        return [notice.summary for notice in self._control.tasks.drain_notices(self._parent)]

    # -- the tools --------------------------------------------------------------------

    @overload
    def _handle(
        self, name: str, arguments: object, *, defer_wait: Literal[False]
    ) -> ToolResult: ...

    @overload
    def _handle(
        self, name: str, arguments: object, *, defer_wait: Literal[True]
    ) -> ToolResult | TaskOutputArgs: ...

    def _handle(
        self, name: str, arguments: object, *, defer_wait: bool
    ) -> ToolResult | TaskOutputArgs:
        # With ``defer_wait``, a task_output that must wait is handed back to the caller
        # (acall waits without a thread); everything else is answered here.
        try:
            args = parse_arguments(name, arguments)
        except SubagentControlError as exc:
            return _invalid(exc)
        except Exception as exc:
            return self._internal(name, exc)
        if defer_wait and isinstance(args, TaskOutputArgs) and args.wait:
            return args
        try:
            return self._run(args)
        except SubagentControlError as exc:
            return _refused(exc)
        except Exception as exc:
            return self._internal(name, exc)

    def _run(self, args: BaseModel) -> ToolResult:
        if isinstance(args, SubagentArgs):
            return self._subagent(args)
        if isinstance(args, SendMessageArgs):
            return self._send_message(args)
        if isinstance(args, TaskOutputArgs):
            return self._task_output(args)
        if isinstance(args, TaskKillArgs):
            return self._task_kill(args)
        if isinstance(args, TaskListArgs):
            return self._task_list()
        if isinstance(args, ListAgentsArgs):
            return self._list_agents()
        if isinstance(args, SetBudgetArgs):
            return self._set_budget(args)
        if isinstance(args, AnswerArgs):
            return self._answer(args)
        raise TypeError(f"no handler for {type(args).__name__}")

    def _subagent(self, args: SubagentArgs) -> ToolResult:
        start = self._control.start_continuable(
            ContinuableStartSpec(
                provider=self._provider,
                label=args.description,
                prompt=[TextBlock(text=args.prompt)],
                parent=self._parent,
            )
        )
        return ToolResult(f"started subagent {start.child_id} as task {start.task_id}")

    def _send_message(self, args: SendMessageArgs) -> ToolResult:
        child_id = args.subagent_id
        # The API would start a Task that fails on an id this parent does not own; the
        # model is better served by a refusal that changes nothing.
        if not self._owns(child_id):
            raise SubagentControlError(
                ErrorCode.CHILD_NOT_FOUND,
                f"you have no subagent {child_id!r}; nothing was sent",
                child_id=child_id,
            )
        result = self._control.send_message(
            self._parent,
            child_id,
            [TextBlock(text=args.message)],
            MessageSource(kind="coordinator", sender_session_id=self._parent.session_id),
        )
        if result.route == "steered":
            return ToolResult(f"message delivered to running task {result.task_id}")
        return ToolResult(f"message started task {result.task_id} continuing subagent {child_id}")

    def _owns(self, child_id: str) -> bool:
        """Whether ``child_id`` is this parent's child, at a cost that does not grow with
        the parent's children and Tasks (a steer's critical path).

        A stored child's header names its parent: one point read, then remembered, as a
        child's parent never changes (and a stored child is never deleted). A child the
        store does not have may still be starting (durable only once its run is published),
        known by its running initial Task: only then are the parent's children listed, as
        `SubagentControl.children` reads them (Tasks first, so a start that publishes
        meanwhile is in one of the two). Such a child is not remembered: a start that fails
        before publishing leaves no child to send to.
        """
        with self._owned_lock:
            if child_id in self._owned:
                self._owned.move_to_end(child_id)
                return True
        store = self._control.store
        if store is not None and _plausible_id(child_id):
            parent = store.spend.parent_of(child_id)
            if parent is not None:
                if parent != self._parent.session_id:
                    return False  # another session's child: its parent never changes
                with self._owned_lock:
                    self._owned[child_id] = None
                    if len(self._owned) > _OWNED_CACHE:
                        self._owned.popitem(last=False)
                return True
        return any(view.child_id == child_id for view in self._control.children(self._parent))

    def _task_output(self, args: TaskOutputArgs) -> ToolResult:
        tasks = self._control.tasks
        if not args.wait:
            return _output_result(tasks.get(args.task_id, requester=self._parent))
        try:
            snapshot = tasks.wait(args.task_id, args.timeout_s, requester=self._parent)
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.TIMEOUT:
                raise
            # Still running: say so with what there is; the model may wait again.
            snapshot = tasks.get(args.task_id, requester=self._parent)
        return _output_result(snapshot)

    def _task_kill(self, args: TaskKillArgs) -> ToolResult:
        tasks = self._control.tasks
        snapshot = tasks.get(args.task_id, requester=self._parent)
        if snapshot.status.is_terminal:
            return ToolResult(
                f"task {snapshot.id} already {snapshot.status.value}; nothing to stop"
            )
        tasks.kill(snapshot.id, requester=self._parent)
        return ToolResult(
            f"stop requested for task {snapshot.id}; task_output with wait=true shows when "
            "it has stopped"
        )

    def _task_list(self) -> ToolResult:
        lines = [_task_line(task) for task in self._control.tasks.list(self._parent)]
        return ToolResult("\n".join(lines) if lines else "(no tasks)")

    def _list_agents(self) -> ToolResult:
        # The documented line per child, then what the child spent when anything was recorded.
        lines = [
            f"{view.child_id} [{'running' if view.running else 'ready'}] — "
            f"{_one_line(view.label or '')}"
            f"{' — ' + usage_text(view.usage) if view.usage.stored() else ''}"
            for view in self._control.children(self._parent)
        ]
        return ToolResult("\n".join(lines) if lines else "(no subagents)")

    def _set_budget(self, args: SetBudgetArgs) -> ToolResult:
        limits = args.limits()
        self._control.set_budget(self._parent, args.subagent_id, Budget(**limits))
        told = ", ".join(f"{name} {value:g}" for name, value in limits.items())
        return ToolResult(f"budget of subagent {args.subagent_id} set: {told}")

    def _answer(self, args: AnswerArgs) -> ToolResult:
        self._control.answer(self._parent, args.request_id, allow=args.allow, note=args.note)
        verdict = "allowed: the tool runs" if args.allow else "denied: the tool does not run"
        return ToolResult(f"request {args.request_id} {verdict}, and the subagent goes on")

    # -- errors -----------------------------------------------------------------------

    def _internal(self, name: object, exc: Exception) -> ToolResult:
        # Never into the harness: the model gets a readable error, the operator the trace.
        log.exception("tool %r failed unexpectedly for parent %s", name, self._parent.session_id)
        return ToolResult.error(
            INTERNAL_ERROR,
            f"the tool failed unexpectedly ({type(exc).__name__}: {_one_line(str(exc))[:200]}); "
            "this is not a problem with your arguments. Check task_list before retrying, in "
            "case it took effect.",
        )


def _invalid(exc: SubagentControlError) -> ToolResult:
    # Argument errors already say what to send instead.
    return ToolResult.error(exc.code.value, exc.message)


def _refused(exc: SubagentControlError) -> ToolResult:
    hint = _HINTS.get(exc.code)
    message = exc.message if hint is None else f"{exc.message.rstrip('. ')}. {hint}"
    return ToolResult.error(exc.code.value, message)


def _output_result(snapshot: TaskSnapshot) -> ToolResult:
    outcome = snapshot.outcome
    if snapshot.request is not None and outcome is None:
        body = _request_text(snapshot)
    elif outcome is None:
        body = ""
    elif outcome.status is TaskStatus.COMPLETED:
        body = outcome.output or ""
    else:
        body = outcome.detail or ""
    return ToolResult(f"{body}\n[status: {snapshot.status.value}]")


def _request_text(snapshot: TaskSnapshot) -> str:
    """What a task waiting for an approval shows: the request, and how to answer it."""
    request = snapshot.request
    assert request is not None
    arguments = _one_line(dumps(request.arguments))
    if len(arguments) > _ARGUMENTS_SHOWN:
        arguments = arguments[: _ARGUMENTS_SHOWN - 1] + "…"
    text = f"the subagent asks to run {request.tool} with {arguments}"
    if request.reason:
        text += f" (its reason: {_one_line(request.reason)[:200]})"
    return f"{text}; answer it with answer(request_id={request.id!r}, allow=true or false)"


def _task_line(task: TaskSnapshot) -> str:
    line = f"{task.id} [{task.status.value}] — {_one_line(task.label)}"
    if task.child_id:
        line = f"{line} (subagent {task.child_id})"
    if task.request is not None:
        line = f"{line} — asks to run {task.request.tool}: request {task.request.id}"
    return f"{line} — {usage_text(task.usage)}" if task.usage.stored() else line


def _plausible_id(child_id: str) -> bool:
    """Whether the store can be asked about ``child_id`` as it is (ours are uuid4
    strings; PostgreSQL refuses a NUL in text, and a driver cannot encode a lone
    surrogate): anything else takes the listing's path, which compares in Python."""
    return child_id.isascii() and "\x00" not in child_id


def _one_line(text: str) -> str:
    # Listings are one line per item; a multi-line label must not break that.
    return " ".join(text.split())
