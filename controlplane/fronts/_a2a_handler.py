"""`ControlPlaneHandler`: A2A requests answered by the control plane, for one parent session.

Not the SDK's default handler: that one runs an agent per request and queues a message for
a working Task until the Task ends, where ours steers it at once (`send_message`, route
``steered``, the same Task answered). Nothing is kept here between requests: every answer
is read from the store (Task rows, transcripts), so any server process on it answers for
any Task, also after a restart; streams follow the transcript with a bounded backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length

from actors import follow_up_label
from controlplane.aio import AsyncSubagentControl
from controlplane.contract import (
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    SessionEvent,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from controlplane.fronts._a2a_answers import verdict_of
from controlplane.fronts._a2a_errors import a2a_error, message_blocks
from controlplane.fronts._a2a_list import list_page
from controlplane.fronts._a2a_view import (
    TERMINAL_STATES,
    a2a_state,
    final_events,
    task_view,
    turn_of,
    update_of,
)
from controlplane.runtime._asend import running_here, send_async

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["ControlPlaneHandler"]

T = TypeVar("T")

POLL_FIRST_S: Final = 0.02
POLL_MAX_S: Final = 0.25
"""A stream looks at the store again this soon after news, backing off to the maximum
while nothing changes; a Task of this process that settles wakes it at once."""
_RELEASE_S: Final = 5.0
"""How long an ended Task's answer waits for its supervisor to let the child go (a
step behind the settlement), so a follow-up sent after it resumes the child."""
OWNED_CACHE: Final = 10_000
"""How many children this server remembers as the parent's (the least recently used go)."""
CANCEL_WAIT_S: Final = 10.0
"""How long `CancelTask` waits for the killed Task to settle before answering it as it is."""


class ControlPlaneHandler(RequestHandler):
    """Serves the A2A methods for ``parent``'s children and Tasks; push notifications are
    not offered (see the guide).

    Args:
        control: The open control plane.
        parent: The live parent session every client acts as.
        provider: The provider new children start on.
    """

    def __init__(self, control: SubagentControl, parent: AgentHandle, *, provider: str) -> None:
        self._control = control
        self._aio = AsyncSubagentControl(control)
        self._parent = parent
        self._provider = provider
        self._ours: OrderedDict[str, None] = OrderedDict()  # the children known to be ours

    # -- reads -----------------------------------------------------------------------------

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        validate_history_length(params)
        snapshot = await self._snapshot(params.id)
        return apply_history_length(task_view(snapshot, await self._turn(snapshot)), params)

    @validate_request_params
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        validate_history_length(params)
        snapshots = await _guarded(self._aio.list_tasks(self._parent))
        page = list_page(snapshots, params)
        if params.HasField("history_length") and params.history_length > 0:
            by_id = {snapshot.id: snapshot for snapshot in snapshots}
            for task in page.tasks:
                snapshot = by_id[task.id]
                full = task_view(snapshot, await self._turn(snapshot))
                task.CopyFrom(apply_history_length(full, params))
        return page

    # -- messages ----------------------------------------------------------------------------

    @validate_request_params
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        config = params.configuration
        validate_history_length(config)
        snapshot, answered = await self._deliver(params)
        if not config.return_immediately:
            async for _event in self._follow(snapshot, seen=0, answered=answered):
                pass  # blocking: answered once the Task ends or needs input
            snapshot = await self._snapshot(snapshot.id)
        # The history only when asked for: it is the child's transcript, read whole, and
        # a steer's answer must not cost more as the child's life grows.
        asked = config.HasField("history_length") and config.history_length > 0
        turn = await self._turn(snapshot) if asked else []
        return apply_history_length(task_view(snapshot, turn), config)

    @validate_request_params
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        snapshot, answered = await self._deliver(params)
        async for event in self._watch(snapshot, answered=answered):
            yield event

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        snapshot = await self._snapshot(params.id)
        if a2a_state(snapshot) in TERMINAL_STATES:
            raise UnsupportedOperationError(
                message=f"task {snapshot.id} is {snapshot.status.value}: it has ended; get it "
                "with GetTask"
            )
        async for event in self._watch(snapshot):
            yield event

    @validate_request_params
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        snapshot = await self._snapshot(params.id)
        if a2a_state(snapshot) in TERMINAL_STATES:
            raise TaskNotCancelableError(
                message=f"task {snapshot.id} is {snapshot.status.value}: it has ended"
            )
        await _guarded(self._aio.kill(snapshot.id, requester=self._parent))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for _event in self._follow(snapshot, seen=0):
                    pass
        snapshot = await self._snapshot(snapshot.id)
        return task_view(snapshot, await self._turn(snapshot))

    # -- not offered -------------------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError

    # -- routing a message -------------------------------------------------------------------

    async def _deliver(self, params: SendMessageRequest) -> tuple[TaskSnapshot, str | None]:
        """Start, steer or resume, as the message's ids say, or answer the approval request
        the Task it names waits on; the Task that took it, and the request it answered.

        A steer of a Task running here (named by its id, or by its context) is sent from
        the loop (`controlplane.runtime._asend`: no worker waits on the child's supervisor)
        and answered from the Task's in-memory snapshot. Every other way is one
        worker-thread call, its Task reads included: a hop costs more than the in-memory
        read of a live Task, and more again while a new activation publishes in this
        process (``python -m benchmarks --sections a2a``).
        """
        message = params.message
        child_id: str | None = None
        if message.task_id:
            named = running_here(self._control, message.task_id, self._parent)
            if named is not None and named.child_id is not None:
                _check_context(named, message.context_id)
                return await self._steer(named.child_id, message_blocks(message)), None
            sent, answered = await _guarded(self._aio.run_blocking(self._to_named, message))
            if sent is not None:
                return sent, answered
        blocks = message_blocks(message)
        if message.context_id and not message.task_id:
            child_id = await self._own_child(message.context_id)
        if child_id is None:
            spec = ContinuableStartSpec(
                provider=self._provider,
                label=follow_up_label(blocks),
                prompt=list(blocks),
                parent=self._parent,
            )
            started, snapshot = await _guarded(self._aio.run_blocking(self._start, spec))
            self._remember(started.child_id)
            return snapshot, None
        return await self._steer(child_id, blocks), None

    async def _steer(self, child_id: str, blocks: Sequence[TextBlock]) -> TaskSnapshot:
        """Steer or resume ``child_id`` from the loop; the Task that took the message (read
        in memory while it runs here, else in a worker)."""
        sent = await _guarded(send_async(self._control, self._parent, child_id, blocks))
        return await self._snapshot(sent.task_id)

    def _to_named(self, message: Message) -> tuple[TaskSnapshot | None, str | None]:
        """Deliver a message naming a Task (blocking): the answer to the approval request
        it waits on (`controlplane.fronts._a2a_answers`), else a steer of its child, which
        must be working and, when a context is named too, in it. The Task that took it and
        the request answered; (None, None) for a Task of no child (the message then starts
        one)."""
        named = self._control.tasks.get(message.task_id, requester=self._parent)
        _check_context(named, message.context_id)
        if a2a_state(named) in TERMINAL_STATES:
            raise UnsupportedOperationError(
                message=f"task {named.id} is {named.status.value}: a message to an ended "
                "task is refused and nothing was delivered; send it to its context "
                "without a taskId to continue the subagent"
            )
        request = named.request
        if named.status is TaskStatus.INPUT_REQUIRED and request is not None:
            if message.role == Role.ROLE_AGENT:
                raise InvalidParamsError(message="the message must be the user's (role ROLE_USER)")
            verdict = verdict_of(message, request)
            self._control.answer(self._parent, request.id, allow=verdict.allow, note=verdict.note)
            return self._control.tasks.get(named.id, requester=self._parent), request.id
        blocks = message_blocks(message)
        if named.child_id is None:
            return None, None
        return self._send(named.child_id, blocks), None

    def _send(self, child_id: str, blocks: Sequence[TextBlock]) -> TaskSnapshot:
        """Steer or resume ``child_id`` (blocking); the Task that took the message."""
        sent = self._control.send_message(self._parent, child_id, blocks)
        return self._control.tasks.get(sent.task_id, requester=self._parent)

    def _start(self, spec: ContinuableStartSpec) -> tuple[ContinuableStart, TaskSnapshot]:
        """Start a child (blocking); its ids and its Task."""
        started = self._control.start_continuable(spec)
        return started, self._control.tasks.get(started.task_id, requester=self._parent)

    async def _own_child(self, context_id: str) -> str | None:
        """``context_id`` if it is a child of ours; None for a new context.

        A stored child's header names its parent (one point read); a child still starting
        is not stored yet, but its Task is, so only then are the parent's Tasks listed.

        Raises:
            TaskNotFoundError: it is another session's child (nothing is said about it).
        """
        if context_id in self._ours:
            self._ours.move_to_end(context_id)
            return context_id
        parent = await _guarded(self._aio.run_blocking(self._stored_parent, context_id))
        if parent is None:
            latest = await _guarded(self._aio.run_blocking(self._latest_by_child))
            parent = self._parent.session_id if context_id in latest else None
        if parent == self._parent.session_id:
            self._remember(context_id)
            return context_id
        if parent is not None:
            raise TaskNotFoundError(
                message=f"no context {context_id!r} for this session; nothing was delivered"
            )
        return None

    def _remember(self, child_id: str) -> None:
        """Keep ``child_id`` as ours: a child's parent never changes, so this is never
        stale, and a steer by context then skips the store."""
        self._ours[child_id] = None
        self._ours.move_to_end(child_id)
        if len(self._ours) > OWNED_CACHE:
            self._ours.popitem(last=False)

    def _latest_by_child(self) -> dict[str, TaskSnapshot]:
        tasks = self._control.tasks.list(self._parent)  # oldest first: the newest wins
        return {t.child_id: t for t in tasks if t.child_id is not None}

    def _stored_parent(self, child_id: str) -> str | None:
        """The parent session of a stored child; None when the store does not have it (or
        cannot be asked about such an id: ours are uuid4 strings)."""
        store = self._control.store
        if store is None or not child_id.isascii() or "\x00" in child_id:
            return None
        return store.spend.parent_of(child_id)

    # -- following a Task ------------------------------------------------------------------

    async def _watch(
        self, snapshot: TaskSnapshot, *, answered: str | None = None
    ) -> AsyncIterator[Event]:
        """The Task as it is now, then its updates to its end (A2A: a Task comes first)."""
        turn = await self._turn(snapshot)
        yield task_view(_past(snapshot, answered), turn)
        seen = max((e.seq for e in turn), default=0)
        async for event in self._follow(snapshot, seen=seen, answered=answered):
            yield event

    async def _follow(
        self, snapshot: TaskSnapshot, *, seen: int, answered: str | None = None
    ) -> AsyncIterator[Event]:
        """The Task's transcript updates after ``seen``, then its final events, read from the
        store: the Task row first, then the transcript, so an ended Task's turn is whole.
        Still waiting on the request ``answered`` (just answered), it reads as working."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_done(done: TaskSnapshot) -> None:
            if done.id == snapshot.id:  # on the settling thread: hand over, never block
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(wake.set)

        unsubscribe = self._control.tasks.on_done(on_done)
        pause = POLL_FIRST_S
        try:
            while True:
                current = _past(await self._snapshot(snapshot.id), answered)
                fresh = [e for e in await self._turn(current) if e.seq > seen]
                for event in fresh:
                    seen = event.seq
                    update = update_of(event, current)
                    if update is not None:
                        yield update
                state = a2a_state(current)
                if state in TERMINAL_STATES:
                    # As after `tasks.wait`: once the client reads the end, a follow-up
                    # starts the child's next activation (its supervisor has let go).
                    with contextlib.suppress(SubagentControlError):
                        await self._aio.wait(current.id, _RELEASE_S, requester=self._parent)
                if state in TERMINAL_STATES or state == TaskState.TASK_STATE_INPUT_REQUIRED:
                    for final in final_events(current):
                        yield final
                    return
                pause = POLL_FIRST_S if fresh else min(pause * 2, POLL_MAX_S)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await wake.wait()
                wake.clear()  # a wake-up counts once: never a loop without a pause
        finally:
            unsubscribe()

    # -- the control plane, translated ---------------------------------------------------------

    async def _snapshot(self, task_id: str) -> TaskSnapshot:
        here = running_here(self._control, task_id, self._parent)
        if here is not None:  # running in this process: read in memory, no worker hop
            return here
        return await _guarded(self._aio.get(task_id, requester=self._parent))

    async def _turn(self, snapshot: TaskSnapshot) -> list[SessionEvent]:
        store = self._control.store
        if snapshot.child_id is None or store is None:
            return []
        try:
            loaded = await self._aio.run_blocking(store.load, snapshot.child_id)
        except SubagentControlError as exc:
            if exc.code == ErrorCode.CHILD_NOT_FOUND:  # not published yet: no turn so far
                return []
            raise a2a_error(exc) from exc
        return turn_of(loaded.events, snapshot.id)


def _check_context(named: TaskSnapshot, context_id: str) -> None:
    """A message naming a Task and a context: the Task must be in it."""
    if context_id and named.child_id != context_id:
        raise InvalidParamsError(
            message=f"task {named.id} is not in context {context_id!r}; nothing was delivered"
        )


def _past(snapshot: TaskSnapshot, answered: str | None) -> TaskSnapshot:
    """``snapshot``, read as working while it still shows the request just ``answered``
    (the answer is written; the run waiting for it has not taken it yet)."""
    request = snapshot.request
    if answered is None or request is None or request.id != answered:
        return snapshot
    return snapshot.model_copy(update={"status": TaskStatus.RUNNING, "request": None})


async def _guarded(call: Awaitable[T]) -> T:
    """Await a control-plane call; its refusal as the A2A error that says the same."""
    try:
        return await call
    except SubagentControlError as exc:
        raise a2a_error(exc) from exc
