"""How a supervisor starts its child's next activation: a resume (a new Task, its message
written with the child's claim in one transaction) or the continuation of a parked Task
(claimed here, its open turn gone on with); either way a plan, a fresh record and inbox,
and the activation actor that runs it.

A mixin of `actors.supervisor.ChildSupervisor`: it runs on the supervisor's thread, in its
mailbox order, and reads and writes the supervisor's own fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors._inbox import ActivationInbox
from actors._outcomes import not_delivered
from actors._record import Activation, ActivationSlot
from actors._transcript import turn_frame
from actors.activation import ActivationActor
from actors.messages import ActivationPlan, BeginActivation, FrameReceipt, Reply, SendMessage
from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    ParkedTask,
    SubagentControlError,
    TextBlock,
    text_of,
)

if TYPE_CHECKING:
    import pykka

    from actors.context import ActorContext

__all__ = ["ActivationStarts", "follow_up_label"]

_LABEL_LIMIT = 80


def follow_up_label(message: tuple[TextBlock, ...]) -> str:
    """The label of a resumed activation's Task, derived from the follow-up message (NUL
    dropped: message text may hold it, a label's text column may not)."""
    label = " ".join(text_of(message).replace("\x00", " ").split())
    if not label:
        return "subagent follow-up"
    if len(label) > _LABEL_LIMIT:
        return label[: _LABEL_LIMIT - 1] + "…"
    return label


class ActivationStarts:
    """The supervisor's start side: `_resume`, `_continue`, `_install`, `_begin`."""

    if TYPE_CHECKING:  # the supervisor's fields and methods these use
        _ctx: ActorContext
        _child_id: str
        _slot: ActivationSlot
        _current: Activation | None
        _label: str | None

        @property
        def actor_ref(self) -> pykka.ActorRef[Any]: ...

        def _fail(self, message: Any, exc: BaseException) -> SubagentControlError | None: ...

        def _retire(self) -> None: ...

    def _continue(self, send: SendMessage, task_id: str) -> Reply:
        """Continue ``task_id``, parked on an approval request, in a new activation here:
        the child claimed for it, its open turn gone on with. A message sent
        with it (a steer to a waiting child) is held and delivered at publication, into
        that same turn: answered ``steered`` with the parked Task's id."""
        recovery = 0
        if send.recovered is not None:
            # Taken over from a runtime that ended mid-turn: claimed here already.
            snapshot, fence, recovery = send.recovered
        else:
            approvals = self._ctx.approvals
            try:
                claimed = approvals.claim_parked(task_id, self._child_id) if approvals else None
            except SubagentControlError as exc:
                if exc.code is not ErrorCode.UNKNOWN_PROVIDER or approvals is None:
                    raise
                if send.continues is not None or not send.message:
                    raise
                # No provider here (a console, a front): the message is written into the
                # parked turn, durably, and the runtime that continues the Task (it has the
                # provider) reads it there.
                if not approvals.steer_parked(task_id, self._child_id, send.message, send.source):
                    raise not_delivered(
                        self._child_id, task_id, "its waiting task went on meanwhile"
                    ) from exc
                return Reply(route="steered", task_id=task_id)
            if claimed is None:
                raise not_delivered(
                    self._child_id,
                    task_id,
                    "its waiting task is being continued by another runtime",
                )
            snapshot, fence = claimed
        if send.continues is None and snapshot.owner_session != send.parent.session_id:
            raise SubagentControlError(
                ErrorCode.UNAUTHORIZED,
                f"child {self._child_id} belongs to another parent session; only its direct "
                "parent can send it messages; the message was not delivered",
                child_id=self._child_id,
            )
        signal = CancelSignal()
        receipt = FrameReceipt() if send.continues is None else None
        self._ctx.tasks.take_over_parked(snapshot, signal)
        trace = self._ctx.telemetry.activation(
            task_id=task_id,
            child_id=self._child_id,
            route="continued",
            origin=send.origin,
            chars=len(text_of(send.message)),
        )
        plan = ActivationPlan(
            kind="continued",
            task_id=task_id,
            child_id=self._child_id,
            parent=send.parent,
            # The message goes into the turn with the continued activation's first write
            # (before its run could park again), and its sender hears `steered` then.
            prompt=send.message if receipt is not None else (),
            source=send.source,
            signal=signal,
            label=snapshot.label,
            trace=trace,
            fence=fence,
            receipt=receipt,
            recovery=recovery,
        )
        self._install(plan)
        try:
            self._begin()
        except Exception as exc:
            self._fail(BeginActivation(), exc)
        if receipt is not None:
            return Reply(route="steered", task_id=task_id, receipt=receipt)
        return Reply(route="started", task_id=task_id)

    def _resume(self, send: SendMessage) -> Reply:
        if self._ctx.budgets is not None:
            # A child with a limit reached could not run its next turn: refused before any
            # Task exists (BUDGET_EXHAUSTED, nothing delivered). A steer never comes here.
            self._ctx.budgets.check_resume(self._child_id)
        signal = CancelSignal()  # created before the Task, so a kill can never miss it
        try:
            # Claimed with its Task: no second activation, in any runtime.
            task, fence = self._ctx.tasks.claim(
                label=follow_up_label(send.message),
                owner=send.parent,
                child_id=self._child_id,
                signal=signal,
                # The message is written with the claim, in its transaction: durable before
                # the answer below, and the activation goes on in that turn.
                opening=lambda admitted: turn_frame(
                    0,
                    task_id=admitted.id,
                    kind="resumed",
                    label=admitted.label,
                    prompt=send.message,
                    source=send.source,
                ),
                # Under concurrency limits it reads queued until its load names its model
                # and the store admits it (`controlplane.runtime.spend._admission`).
                queued=self._ctx.admission is not None,
            )
        except ParkedTask as parked:
            # Its Task waits on an approval request: the message goes into that turn.
            return self._continue(send, parked.parked_task_id)
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND:
                # Refused at the claim, with no Task: nothing here to keep a thread for.
                self._retire()
                raise SubagentControlError(
                    ErrorCode.CHILD_NOT_FOUND,
                    f"there is no child {self._child_id} in the store (a child is stored once "
                    "its first run is published); the message was not delivered and no task "
                    "was started; check the id",
                    child_id=self._child_id,
                ) from None
            raise
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
                fence=fence,
            )
            self._install(plan)
        except BaseException:
            self._ctx.tasks.discard(task.id)  # never admitted: no Task is left behind
            trace.end(None)
            raise
        # Begun here, not by a message to itself: the activation's loop goes to a waiting
        # worker thread (`actors._pool`), a hand-off as cheap as that message, which the
        # supervisor's loop would only take after this answer anyway. Its failure (no
        # thread left) fails the Task: the sender still hears ``started``, at once.
        try:
            self._begin()
        except Exception as exc:
            self._fail(BeginActivation(), exc)
        return Reply(route="started", task_id=task.id)

    def _install(self, plan: ActivationPlan) -> None:
        """Make ``plan`` this child's current activation, with a fresh record and inbox."""
        self._label = plan.label or self._label
        inbox = ActivationInbox(
            plan.child_id,
            plan.task_id,
            signal=plan.signal,
            trace=plan.trace,
            telemetry=self._ctx.telemetry,
        )
        current = Activation(
            plan=plan, inbox=inbox, agent_mark=self._ctx.agents.last_serial(), slot=self._slot
        )
        self._current = current
        current.publish_view()

    def _begin(self) -> None:
        current = self._current
        if current is not None and current.ref is None:
            current.ref = ActivationActor.start(self._ctx, current.plan, self.actor_ref)
