"""The supervisor actor: one per child session; every steer-or-resume decision is a message.

Routing races are resolved by mailbox order, not locks: the supervisor alone decides whether
a message steers the current activation, waits for its publication, or starts the next
activation. It never blocks on another actor; the activation tells it when the run is
published and when the Task has its outcome.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pykka

from actors._answer import NO_ANSWER, answer_of
from actors._base import Actor
from actors._outcomes import error_text, failed
from actors._transcript import ActivationTranscript
from actors.activation import ActivationActor
from actors.context import ActorContext
from actors.messages import (
    ActivationEnded,
    ActivationPlan,
    BeginActivation,
    Describe,
    PassivateIfIdle,
    Published,
    Redirect,
    SendMessage,
    SendReply,
    Settling,
    Steered,
    SupervisorAnswer,
)
from actors.routing import RoutingTable
from controlplane.contract import (
    ActivationNode,
    CancelSignal,
    ErrorCode,
    MessageSource,
    SendResult,
    SubagentControlError,
    SubagentRun,
    SupervisorNode,
    SupervisorState,
    TaskOutcome,
    TaskStatus,
    TextBlock,
    text_of,
)

__all__ = [
    "ChildSupervisor",
    "ChildSupervisorProxy",
    "await_reply",
    "follow_up_label",
    "mailbox_depth",
]

log = logging.getLogger(__name__)

_LABEL_LIMIT = 80
_LIVENESS_POLL_S = 1.0


def follow_up_label(message: tuple[TextBlock, ...]) -> str:
    """The label of a resumed activation's Task, derived from the follow-up message."""
    label = " ".join(text_of(message).split())
    if not label:
        return "subagent follow-up"
    if len(label) > _LABEL_LIMIT:
        return label[: _LABEL_LIMIT - 1] + "…"
    return label


@dataclass(slots=True)
class _Held:
    message: tuple[TextBlock, ...]
    source: MessageSource
    reply: Future[Steered]
    forwarded: str | None = None


@dataclass(slots=True)
class _Current:
    """The association: this child's one activation in this process."""

    plan: ActivationPlan
    # Agents registered after this mark may be the provider's child agent being created.
    agent_mark: int
    started: float = field(default_factory=time.monotonic)
    ref: pykka.ActorRef[Any] | None = None  # the activation actor, once it began
    run: SubagentRun | None = None
    transcript: ActivationTranscript | None = None
    settling: bool = False  # the run's result is in; dispose and outcome follow
    held: list[_Held] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.plan.task_id

    @property
    def signal(self) -> CancelSignal:
        return self.plan.signal


class ChildSupervisor(Actor):
    """Owns one child's association and decides, in arrival order, where messages go."""

    # A cold resume starts one of these first: on a reused thread, it skips a thread start
    # (its loop is pykka's own, so stop and error rules hold as on a thread of its own).
    pooled_loop = True

    def __init__(
        self,
        context: ActorContext,
        table: RoutingTable,
        child_id: str,
        *,
        parent_session: str | None = None,
        initial: ActivationPlan | None = None,
    ) -> None:
        super().__init__()
        self._ctx = context
        self._table = table
        self._retired = False
        # Why this supervisor failed, once it has: it only waits for its activation to end.
        self._broken: str | None = None
        self._child_id = child_id
        self._parent_session = parent_session
        self._current: _Current | None = None
        self._last_activity_s = time.time()  # as a float: set on every message
        # Since when it has had no activation and no message (monotonic); None while busy.
        self._idle_since: float | None = None if initial is not None else time.monotonic()
        if initial is not None:
            # Installed before the actor starts, so the first send already finds it; the
            # activation itself begins on `BeginActivation`, once the root has routed here.
            self._current = _Current(plan=initial, agent_mark=context.agents.last_serial())

    # -- pykka hooks ----------------------------------------------------------------

    def on_start(self) -> None:
        self._ctx.telemetry.supervisors_live(1)

    def on_receive(self, message: Any) -> Any:
        try:
            if isinstance(message, Describe):  # looking is not activity
                return self._describe()
            if isinstance(message, PassivateIfIdle):  # nor is being offered to retire
                return self._passivate_if_idle(message.idle_for_s)
            self._last_activity_s = time.time()
            try:
                return self._handle(message)
            finally:
                self._idle_since = time.monotonic() if self._current is None else None
        except BaseException as exc:
            # Escaping, pykka would stop this actor without `on_stop` (or, for a
            # BaseException, every actor): the Task would stay running, held senders would
            # wait forever and the child would be wedged. Fail what this actor owns instead.
            return self._fail(message, exc)

    def _handle(self, message: Any) -> Any:
        if isinstance(message, SendMessage):
            # Retired, with a stop queued behind this message: not handled, so the caller
            # may send it again to the child's next supervisor.
            if self._retired:
                return Redirect()
            if self._broken is not None:
                task_id = self._current.task_id if self._current else None
                return _not_delivered(self._child_id, task_id, self._broken)
            return self._on_send(message)
        if isinstance(message, BeginActivation):
            return self._begin()
        if isinstance(message, Published):
            return self._on_published(message)
        if isinstance(message, Settling):
            return self._on_settling(message)
        if isinstance(message, ActivationEnded):
            return self._on_ended(message)
        raise TypeError(f"supervisor {self._child_id} got an unknown message {message!r}")

    def on_stop(self) -> None:
        self._ctx.telemetry.supervisors_live(-1)
        current, self._current = self._current, None
        if current is None:
            return
        current.signal.abort("control plane stopped")
        self._fail_held(current, "the control plane stopped", ErrorCode.CLOSED)
        if current.ref is None:  # never began: no activation will ever settle its Task
            stopped = TaskOutcome(
                status=TaskStatus.KILLED, detail="control plane stopped", code=ErrorCode.CLOSED
            )
            self._ctx.tasks.settle(current.task_id, stopped)
            current.plan.trace.end(stopped)
        self._ctx.tasks.release(current.task_id)

    def _fail(self, message: Any, exc: BaseException) -> SubagentControlError | None:
        """Contain a failure of this supervisor's own code (a bug, or no thread left for
        the activation): the activation's Task settles ``failed`` (detail names the cause),
        held messages are not delivered, and the supervisor retires — at once, or once its
        running activation has ended — so the child's next message gets a new one."""
        why = f"internal error in the supervisor of child {self._child_id}: {error_text(exc)}"
        log.error("%s (while handling %s)", why, type(message).__name__, exc_info=exc)
        try:
            self._broken = self._broken or why
            current = self._current
            if current is not None:
                current.signal.abort(why, cause=ErrorCode.INTERNAL)
                self._fail_held(current, why, ErrorCode.NOT_DELIVERED)
                if current.ref is None:  # never began: no activation will settle its Task
                    outcome = failed(why, ErrorCode.INTERNAL)
                    self._ctx.tasks.settle(current.task_id, outcome)
                    current.plan.trace.end(outcome)
                    self._ctx.tasks.release(current.task_id)
                    self._current = None
        finally:
            if self._current is None:
                self._retire()
        if not isinstance(message, SendMessage):
            return None
        return SubagentControlError(
            ErrorCode.INTERNAL,
            f"{why}; the message was not delivered; retry it",
            child_id=self._child_id,
        )

    # -- decisions -------------------------------------------------------------------

    def _on_send(self, send: SendMessage) -> SupervisorAnswer:
        current = self._current
        conflict = self._squatter(current)
        if conflict is not None:
            return conflict
        if current is None:
            if send.forwarded is not None:
                return _not_delivered(self._child_id, None, "it has no running activation here")
            return self._resume(send)
        if self._ctx.tasks.owner_of(current.task_id) != send.parent.session_id:
            if current.run is None and self._parent_session in (None, send.parent.session_id):
                # Another session's resume, not yet authorized: it will be refused at its
                # load if the sender is the child's parent, so tell the sender to retry
                # (neither the Task's id nor its owner is named to a possible stranger).
                return _not_delivered(self._child_id, None, "an activation of it is starting")
            return SubagentControlError(
                ErrorCode.TASK_NOT_FOUND,
                f"child {self._child_id} has no task for this session",
                child_id=self._child_id,
            )
        status = self._ctx.tasks.status_of(current.task_id)
        if status is not TaskStatus.RUNNING or current.signal.aborted:
            what = "being killed" if status is TaskStatus.RUNNING else _status_word(status)
            return _not_delivered(
                self._child_id, current.task_id, f"task {current.task_id} is {what}"
            )
        if current.run is None:
            held = _Held(send.message, send.source, Future(), send.forwarded)
            current.held.append(held)
            self._ctx.telemetry.held_messages(1)
            return held.reply
        return self._steer(current, current.run, send.message, send.source, send.forwarded)

    def _steer(
        self,
        current: _Current,
        run: SubagentRun,
        message: tuple[TextBlock, ...],
        source: MessageSource,
        forwarded: str | None = None,
    ) -> Steered | SubagentControlError:
        steer = run.steer
        if steer is None:
            return _not_delivered(
                self._child_id,
                current.task_id,
                "its provider has no live delivery into a running turn",
            )
        assert current.transcript is not None
        try:
            receipt = current.transcript.steer(
                lambda: steer(message, source),
                message,
                source,
                task_id=current.task_id,
                forwarded=forwarded,
            )
        except SubagentControlError as exc:
            exc.task_id = current.task_id
            return exc
        current.plan.trace.steered(message, source.kind)
        return Steered(receipt)

    def _resume(self, send: SendMessage) -> SupervisorAnswer:
        signal = CancelSignal()  # created before the Task, so a kill can never miss it
        try:
            task = self._ctx.tasks.start(
                label=follow_up_label(send.message),
                owner=send.parent,
                child_id=self._child_id,
                signal=signal,
                claim_child=True,  # no second activation, in any runtime
            )
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND:
                # Refused at the claim, with no Task: nothing here to keep a thread for.
                self._retire()
                return SubagentControlError(
                    ErrorCode.CHILD_NOT_FOUND,
                    f"there is no child {self._child_id} in the store (a child is stored once "
                    "its first run is published); the message was not delivered and no task "
                    "was started; check the id",
                    child_id=self._child_id,
                )
            return exc
        trace = self._ctx.telemetry.activation(
            task_id=task.id,
            child_id=self._child_id,
            route="resumed",
            origin=send.origin,
            chars=len(text_of(send.message)),
        )
        try:
            plan = ActivationPlan(
                kind="resumed",
                task_id=task.id,
                child_id=self._child_id,
                parent=send.parent,
                prompt=send.message,
                source=send.source,
                signal=signal,
                label=task.label,
                trace=trace,
                fence=self._ctx.tasks.fence_of(task.id),
            )
            self._current = _Current(plan=plan, agent_mark=self._ctx.agents.last_serial())
        except BaseException:
            self._ctx.tasks.discard(task.id)  # never admitted: no Task is left behind
            trace.end(None)
            raise
        self.actor_ref.tell(BeginActivation())  # after this answer has gone out
        return SendResult(route="started", task_id=task.id)

    def _on_published(self, published: Published) -> None:
        current = self._current
        if current is None or current.task_id != published.task_id:
            return
        current.run = published.run
        current.transcript = published.transcript
        self._parent_session = current.plan.parent.session_id  # authorized by now
        # Held messages passed the ownership check on a guess (an agent registered after
        # the activation began may be the run's); now the run says which agent is its own.
        squatter = self._squatter(current)
        # Each leaves `held` only once resolved: if anything here raises, `_fail` still
        # finds the rest and tells their senders.
        while current.held:
            item = current.held[0]
            if squatter is not None:
                outcome: Steered | SubagentControlError = squatter
            elif current.signal.aborted:
                outcome = _not_delivered(
                    self._child_id, current.task_id, "its task was killed before delivery"
                )
            else:
                outcome = self._steer(
                    current, published.run, item.message, item.source, item.forwarded
                )
            current.held.pop(0)
            self._ctx.telemetry.held_messages(-1)
            _resolve(item.reply, outcome)

    def _on_settling(self, settling: Settling) -> None:
        current = self._current
        if current is not None and current.task_id == settling.task_id:
            current.settling = True

    def _on_ended(self, ended: ActivationEnded) -> None:
        current = self._current
        if current is not None and current.task_id == ended.task_id:
            self._fail_held(
                current,
                "the activation ended before it could take the message",
                ErrorCode.NOT_DELIVERED,
            )
            self._current = None
        # Only now, with the association gone, may `tasks.wait()` return.
        self._ctx.tasks.release(ended.task_id)
        if (not ended.durable or self._broken is not None) and self._current is None:
            self._retire()

    def _passivate_if_idle(self, idle_for_s: float) -> None:
        idle_since = self._idle_since
        if idle_since is not None and time.monotonic() - idle_since >= idle_for_s:
            self._retire()

    def _retire(self) -> None:
        """Stop, handing the child back to the store: it is not in the store (a send to an
        unknown id, or a start that never published), or it has been idle long enough
        (passivation). Keeping the thread would leak one per child ever touched. Messages
        already queued behind are answered `Redirect` and go to the child's next
        supervisor, which the root creates on demand."""
        if self._retired:
            return
        self._table.discard(self._child_id, self.actor_ref)
        self._retired = True
        self.stop()

    # -- helpers ---------------------------------------------------------------------

    def _begin(self) -> None:
        current = self._current
        if current is not None and current.ref is None:
            current.ref = ActivationActor.start(self._ctx, current.plan, self.actor_ref)

    def _squatter(self, current: _Current | None) -> SubagentControlError | None:
        """``OWNERSHIP_CONFLICT`` if a live agent uses the child's id but is not its run's."""
        agent = self._ctx.agents.get(self._child_id)
        if agent is None:
            return None
        if current is not None:
            if current.run is not None and current.run.local_agent is agent:
                return None
            # Not yet published: an agent registered since the activation began may be the
            # one its provider is creating (rechecked at publication); an older one is not.
            if current.run is None and agent.serial > current.agent_mark:
                return None
        return SubagentControlError(
            ErrorCode.OWNERSHIP_CONFLICT,
            f"a live agent that is not this child's run already uses id {self._child_id}; "
            "it is never adopted: dispose it, then retry",
            child_id=self._child_id,
            task_id=current.task_id if current else None,
        )

    def _fail_held(self, current: _Current, why: str, code: ErrorCode) -> None:
        held, current.held = current.held, []
        self._ctx.telemetry.held_messages(-len(held))
        for item in held:
            _resolve(
                item.reply,
                SubagentControlError(
                    code,
                    f"child {self._child_id}: {why}; the message was not delivered",
                    child_id=self._child_id,
                    task_id=current.task_id,
                ),
            )

    def _state(self) -> SupervisorState:
        current = self._current
        if current is None:
            return "idle"
        status = self._ctx.tasks.status_of(current.task_id)
        if status is not TaskStatus.RUNNING or current.signal.aborted or current.settling:
            return "settling"
        return "starting" if current.run is None else "running"

    def _describe(self) -> SupervisorNode:
        current = self._current
        activation = None
        status = None
        if current is not None:
            status = self._ctx.tasks.status_of(current.task_id)
            activation = ActivationNode(
                task_id=current.task_id,
                kind=current.plan.kind,
                published=current.run is not None,
                task_status=(status or TaskStatus.RUNNING).value,
                cancel_reason=current.signal.reason,
                age_s=time.monotonic() - current.started,
                fence=current.plan.fence,
            )
        return SupervisorNode(
            child_id=self._child_id,
            parent_session=self._parent_session
            or (current.plan.parent.session_id if current else None),
            state=self._state(),
            task_id=current.task_id if current else None,
            task_status=status.value if status else None,
            held_messages=len(current.held) if current else 0,
            mailbox_depth=mailbox_depth(self.actor_ref),
            last_activity=datetime.fromtimestamp(self._last_activity_s, UTC),
            activation=activation,
        )


def _status_word(status: TaskStatus | None) -> str:
    return "gone" if status is None else status.value


def mailbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """How many messages wait in an actor's mailbox (a snapshot, for the tree dump)."""
    qsize = getattr(ref.actor_inbox, "qsize", None)
    return int(qsize()) if callable(qsize) else 0


def _not_delivered(child_id: str, task_id: str | None, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id}: {why}; the message was not delivered; retry after it settles",
        child_id=child_id,
        task_id=task_id,
    )


def _resolve(reply: Future[Steered], outcome: Steered | SubagentControlError) -> None:
    if isinstance(outcome, SubagentControlError):
        reply.set_exception(outcome)
    else:
        reply.set_result(outcome)


class ChildSupervisorProxy:
    """Typed access to a supervisor from outside its thread."""

    __slots__ = ("ref",)

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self.ref = ref

    def send(self, send: SendMessage) -> SendReply:
        """Ask the supervisor to route a message: one hop there, one back."""
        return await_reply(self.ref, self.ref.ask(send, block=False))


def await_reply(supervisor: pykka.ActorRef[Any], future: pykka.Future[Any]) -> SendReply:
    """A supervisor's answer to a `SendMessage`; `Redirect` if it stopped without handling
    it (then sending it again cannot duplicate it). A message held until publication is
    waited for here, for as long as its supervisor lives: the answer is never a future."""
    answer = answer_of(supervisor, future)
    if answer is NO_ANSWER:
        return Redirect()
    if isinstance(answer, Future):
        return _delivery_of(supervisor, answer)
    return cast(SendReply, answer)


def _delivery_of(supervisor: pykka.ActorRef[Any], held: Future[Steered]) -> SendReply:
    """The outcome of a held message. A supervisor resolves every held message before it
    stops (`on_stop` fails them); one that died without doing so took the message with it,
    undelivered, so its sender is told instead of waiting forever."""
    while True:
        try:
            return held.result(timeout=_LIVENESS_POLL_S)
        except SubagentControlError as exc:
            return exc
        except TimeoutError:
            if supervisor.is_alive() or held.done():
                continue
            return SubagentControlError(
                ErrorCode.NOT_DELIVERED,
                "the child's supervisor stopped before the activation took the message; "
                "the message was not delivered; retry it",
            )
