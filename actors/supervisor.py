"""The supervisor actor: one per child session; every steer-or-resume decision is a message.

Routing races are resolved by mailbox order, not locks: the supervisor alone decides whether
a message steers the current activation, waits for its publication, or starts the next
activation. It never blocks on another actor; the activation tells it when the run is
published and when the Task has its outcome.

It owns its child's one `Activation` record (`actors._record`) and publishes a frozen view
of it after each change: the record's events and effects, and the messages held while a
run parks, are in `actors._holding`; starting the next activation (a resume, a parked
Task's continuation) in `actors._starting`. It decides and never acts for the run: a steer
is put into the activation's inbox (`actors._inbox`) and delivered there, so the supervisor
calls no provider code and holds no lock across a store write; the store work of a resume
or of a parked Task's continuation (its budget check and its claim) is an effect the
activation it starts runs, off this mailbox, whose result comes back into the record's
state machine.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import pykka

from actors._answer import NO_ANSWER, answer_of
from actors._holding import MessageHolding
from actors._outcomes import error_text, failed, not_delivered
from actors._parking import ParkingActor, ask_here
from actors._record import (
    Activation,
    ActivationSlot,
    ActivationView,
    Broke,
    Claimed,
    ClaimFailed,
    Parking,
    RunEnded,
    view_of,
)
from actors._starting import ActivationStarts, follow_up_label
from actors.context import ActorContext
from actors.messages import (
    ActivationEnded,
    ActivationPlan,
    BeginActivation,
    ClaimCommitted,
    ClaimRefused,
    Describe,
    PassivateIfIdle,
    Published,
    Reply,
    SendMessage,
    Settling,
)
from actors.routing import RoutingTable
from controlplane.contract import (
    ActivationNode,
    ErrorCode,
    SubagentControlError,
    SupervisorNode,
    SupervisorState,
    TaskOutcome,
    TaskStatus,
    Usage,
)

__all__ = [
    "ChildSupervisor",
    "ChildSupervisorProxy",
    "follow_up_label",
    "mailbox_depth",
]

log = logging.getLogger(__name__)


class ChildSupervisor(ActivationStarts, MessageHolding, ParkingActor):
    """Owns one child's association — its current `Activation` record — and decides, in
    arrival order, where messages go."""

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
        slot: ActivationSlot | None = None,
    ) -> None:
        super().__init__()
        self._ctx = context
        self._table = table
        self._retired = False
        self._child_id = child_id
        self._parent_session = parent_session
        self._slot = slot or ActivationSlot()
        self._current: Activation | None = None
        self._last_activity_s = time.time()  # as a float: set on every message
        self._label: str | None = None  # its latest activation's, for the live views
        # Since when it has had no activation and no message (monotonic); None while busy.
        self._idle_since: float | None = None if initial is not None else time.monotonic()
        if initial is not None:
            # Installed before the actor starts, so the first send already finds it; the
            # activation itself begins on `BeginActivation`, once the root has routed here.
            self._install(initial)

    # -- pykka hooks ----------------------------------------------------------------

    def on_start(self) -> None:
        self._ctx.telemetry.supervisors_live(1)

    def on_receive(self, message: Any) -> Any:
        if self._retired and isinstance(message, SendMessage):
            # Retired, with a stop queued behind this message: not handled, so the caller
            # sends it again to the child's next supervisor (as for one queued at the stop).
            raise pykka.ActorDeadError(f"the supervisor of child {self._child_id} retired")
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
        except SubagentControlError as exc:
            if isinstance(message, SendMessage):
                raise  # the send's refusal: its sender reads it from the future
            self._fail(message, exc)
            return None
        except BaseException as exc:
            # Escaping, pykka would stop this actor without `on_stop` (or, for a
            # BaseException, every actor): the Task would stay running, held senders would
            # wait forever and the child would be wedged. Fail what this actor owns instead.
            error = self._fail(message, exc)
            if error is not None:
                raise error from None
            return None

    def _handle(self, message: Any) -> Any:
        if isinstance(message, SendMessage):
            current = self._current
            if current is not None and current.broken is not None:
                raise not_delivered(self._child_id, current.task_id, current.broken)
            return self._on_send(message)
        if isinstance(message, BeginActivation):
            return self._begin()
        if isinstance(message, Published):
            return self._on_published(message)
        if isinstance(message, Settling):
            return self._on_settling(message)
        if isinstance(message, ActivationEnded):
            return self._on_ended(message)
        if isinstance(message, ClaimCommitted):
            return self._on_claim_committed(message)
        if isinstance(message, ClaimRefused):
            return self._on_claim_refused(message)
        raise TypeError(f"supervisor {self._child_id} got an unknown message {message!r}")

    def on_stop(self) -> None:
        self._ctx.telemetry.supervisors_live(-1)
        current = self._current
        if current is None:
            return
        self._drop()
        current.signal.abort("control plane stopped")
        self._close_inbox(current, ErrorCode.CLOSED, "the control plane stopped")
        if current.phase == "claiming":
            # Its claim's sender is its activation's to answer (the claim may be committing
            # now); aborted, a claim that commits ends its turn at once, killed.
            claim = current.claim
            if current.ref is None and claim is not None:
                why = not_delivered(self._child_id, None, "the control plane stopped")
                claim.held.resolve(None, why)
            elif claim is not None and claim.plan is not None:  # it committed: as below
                self._ctx.tasks.on_view(view_of(claim.plan, "ended"))
            return
        if current.ref is None:  # never began: no activation will ever settle its Task
            stopped = TaskOutcome(
                status=TaskStatus.KILLED, detail="control plane stopped", code=ErrorCode.CLOSED
            )
            self._ctx.tasks.settle(current.task_id, stopped)
            current.plan.trace.end(stopped)
        # Gone with this supervisor, whatever its run still does: `wait` returns.
        self._ctx.tasks.on_view(view_of(current.plan, "ended"))

    def on_failure(self, *_exc_info: Any) -> None:
        # Stopped by an error pykka caught (on_stop is not called then): no sender may
        # wait for ever on this supervisor's activation.
        if self._current is not None:
            self._close_inbox(self._current, ErrorCode.NOT_DELIVERED, "its supervisor failed")

    def _fail(self, message: Any, exc: BaseException) -> SubagentControlError | None:
        """Contain a failure of this supervisor's own code (a bug, or no thread left for
        the activation): the activation's Task settles ``failed`` (detail names the cause),
        held messages are not delivered, and the supervisor retires — at once, or once its
        running activation has ended — so the child's next message gets a new one."""
        why = f"internal error in the supervisor of child {self._child_id}: {error_text(exc)}"
        log.error("%s (while handling %s)", why, type(message).__name__, exc_info=exc)
        try:
            current = self._current
            if current is not None:
                current.signal.abort(why, cause=ErrorCode.INTERNAL)
                self._apply(current, Broke(why))
                if current.phase == "claiming" and current.ref is None:
                    # Its claim never ran: refused, no Task was started.
                    refusal = SubagentControlError(
                        ErrorCode.INTERNAL,
                        f"{why}; the message was not delivered; retry it",
                        child_id=self._child_id,
                    )
                    self._apply(current, ClaimFailed(refusal))
                elif current.ref is None:  # never began: no activation will settle its Task
                    outcome = failed(why, ErrorCode.INTERNAL)
                    self._ctx.tasks.settle(current.task_id, outcome)
                    current.plan.trace.end(outcome)
                    self._apply(current, RunEnded("ended"))
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

    def _on_send(self, send: SendMessage) -> Reply:
        """Decide where ``send`` goes; a refusal is raised (the sender's future has it)."""
        current = self._current
        if current is not None and current.phase == "claiming":
            claimed = current.claim.holding() if current.claim is not None else None
            if claimed is None:
                # A resume's claim runs off this mailbox: held, and decided afresh once its
                # result is in (steered into the claimed turn, most often).
                return self._hold(current, send)
            self._apply(current, Claimed(claimed))  # it committed: decided now
            current = self._current
        conflict = self._squatter(current)
        if conflict is not None:
            raise conflict
        if send.continues is not None:
            return self._continue_ordered(current, send)
        if current is None:
            if send.forwarded is not None:
                raise not_delivered(self._child_id, None, "it has no running activation here")
            return self._resume(send)
        if current.owner_session != send.parent.session_id:
            if current.run is None and self._parent_session in (None, send.parent.session_id):
                # Another session's resume, not yet authorized: it will be refused at its
                # load if the sender is the child's parent, so tell the sender to retry
                # (neither the Task's id nor its owner is named to a possible stranger).
                raise not_delivered(self._child_id, None, "an activation of it is starting")
            raise SubagentControlError(
                ErrorCode.TASK_NOT_FOUND,
                f"child {self._child_id} has no task for this session",
                child_id=self._child_id,
            )
        if self._parking(current):
            # Its run is parking on an approval request: held, and delivered into that
            # Task's continued turn once it has parked (`_on_ended`).
            return self._hold(current, send)
        if not current.takes_messages or current.signal.aborted:
            status = current.status
            what = "being killed" if status is TaskStatus.RUNNING else status.value
            raise not_delivered(
                self._child_id, current.task_id, f"task {current.task_id} is {what}"
            )
        if current.run is not None and current.run.steer is None:
            raise not_delivered(
                self._child_id,
                current.task_id,
                "its provider has no live delivery into a running turn",
            )
        # Steered into the turn (or held until its publication) by the sender's own thread:
        # this supervisor never calls the run nor waits for the record's write.
        inbox = current.inbox
        delivery = inbox.put(send)
        return Reply(route="steered", task_id=current.task_id, inbox=inbox, delivery=delivery)

    def _continue_ordered(self, current: Activation | None, send: SendMessage) -> Reply:
        """Continue a parked Task with no message (its answer came)."""
        task_id = send.continues
        assert task_id is not None
        if current is not None and current.task_id == task_id:
            if current.plan.kind != "continued" and current.phase == "published":
                # The store has it parked while its run here is still parking.
                self._apply(current, Parking())
            if self._parking(current) or current.phase == "settling":
                # Its run here is ending: the Task is continued (or not) once it has.
                return self._hold(current, send)
            return Reply(route="started", task_id=task_id)  # it goes on here already
        if current is not None:
            raise not_delivered(self._child_id, task_id, "another activation of it runs here")
        return self._continue(send, task_id)

    def _passivate_if_idle(self, idle_for_s: float) -> None:
        idle_since = self._idle_since
        if idle_since is not None and time.monotonic() - idle_since >= idle_for_s:
            self._retire()

    def _retire(self) -> None:
        """Stop, handing the child back to the store: it is not in the store (a send to an
        unknown id, or a start that never published), or it has been idle long enough
        (passivation). Keeping the thread would leak one per child ever touched. Messages
        already queued behind are answered `pykka.ActorDeadError` (never handled) and go
        to the child's next supervisor, which the root creates on demand."""
        if self._retired:
            return
        self._table.discard(self._child_id, self.actor_ref)
        self._retired = True
        self.stop()

    # -- helpers ---------------------------------------------------------------------

    def _squatter(self, current: Activation | None) -> SubagentControlError | None:
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

    def _state(self) -> SupervisorState:
        current = self._current
        if current is None:
            return "idle"
        return current.publish_view().state

    def _last_active_s(self, current: Activation | None) -> float:
        """When it last had a message: its own, or a steer put straight into its
        activation's inbox."""
        direct = current.inbox.last_direct_s if current is not None else 0.0
        return max(self._last_activity_s, direct)

    def _describe(self) -> SupervisorNode:
        current = self._current
        activation = None
        view = None
        if current is not None and current.phase == "claiming":
            view = current.publish_view()  # no Task yet: its claim runs
        elif current is not None:
            view = current.publish_view()
            activation = ActivationNode(
                task_id=view.task_id,
                kind=view.kind,
                published=view.published,
                task_status=view.status.value,
                cancel_reason=view.cancel_reason,
                age_s=time.monotonic() - view.started,
                fence=view.fence,
                usage=current.transcript.spent if current.transcript else Usage.zero(),
            )
        return SupervisorNode(
            child_id=self._child_id,
            parent_session=self._parent_session or (view.owner_session if view else None),
            state="idle" if view is None else view.state,
            task_id=(view.task_id or None) if view else None,
            task_status=view.status.value if view and view.task_id else None,
            held_messages=current.inbox.pending + len(current.held) if current else 0,
            mailbox_depth=mailbox_depth(self.actor_ref),
            last_activity=datetime.fromtimestamp(self._last_active_s(current), UTC),
            activation=activation,
            label=self._label,
        )


def mailbox_depth(ref: pykka.ActorRef[Any]) -> int:
    """How many messages wait in an actor's mailbox (a snapshot, for the tree dump)."""
    qsize = getattr(ref.actor_inbox, "qsize", None)
    return int(qsize()) if callable(qsize) else 0


class ChildSupervisorProxy:
    """Typed access to a supervisor from outside its thread."""

    __slots__ = ("ref", "slot")

    def __init__(self, ref: pykka.ActorRef[Any], slot: ActivationSlot | None = None) -> None:
        self.ref = ref
        self.slot = slot or ActivationSlot()

    @property
    def activation(self) -> ActivationView | None:
        """The supervisor's current activation as it last published it (no hop)."""
        return self.slot.view

    def send(self, send: SendMessage) -> Reply | None:
        """Route a message: put straight into the running activation's inbox when its
        supervisor lets senders do so (`ActivationInbox.put_direct`: no hop), else ask the
        supervisor, one hop there and one back. None if it retired or stopped without
        handling it (sending it again cannot duplicate it).

        Raises:
            SubagentControlError: the supervisor refused the message.
        """
        view = self.slot.view
        if view is not None and view.inbox is not None:
            inbox = view.inbox
            delivery = inbox.put_direct(send)
            if delivery is not None:
                inbox.last_direct_s = time.time()
                return Reply(route="steered", task_id=view.task_id, inbox=inbox, delivery=delivery)
        return reply_of(ask_here(self.ref, send))


def reply_of(future: pykka.Future[Any]) -> Reply | None:
    """A supervisor's `Reply` to a `SendMessage`, or None if it never handled it."""
    answer = answer_of(future)
    return None if answer is NO_ANSWER else answer
