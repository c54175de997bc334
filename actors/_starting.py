"""How a supervisor starts its child's next activation: a resume (a new Task, its message
written with the child's claim in one transaction) or the continuation of a parked Task
(the Task claimed for this runtime, its open turn gone on with), each claimed by the
activation it starts, off the supervisor's mailbox; either way a plan, a fresh record and
inbox, and the activation actor that runs it.

A mixin of `actors.supervisor.ChildSupervisor`: it runs on the supervisor's thread, in its
mailbox order, and reads and writes the supervisor's own fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors._inbox import ActivationInbox
from actors._record import Activation, ActivationSlot
from actors.activation import ActivationActor
from actors.messages import (
    ActivationPlan,
    BeginActivation,
    FrameReceipt,
    Reply,
    ResumeClaim,
    SendMessage,
)
from controlplane.contract import CancelSignal, SubagentControlError, TextBlock, text_of

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

    def _continue(self, send: SendMessage, task_id: str, *, checked: bool = False) -> Reply:
        """Continue ``task_id``, parked on an approval request, in a new activation here,
        its open turn gone on with. A message sent with it (a steer to a waiting child)
        goes into that same turn: answered ``steered`` with the parked Task's id once the
        turn took it. The claim (the budget check unless ``checked``, then the parked Task
        claimed for this runtime) is an effect its activation runs off this mailbox, as a
        resume's is: the sender waits for its result, messages sent meanwhile are held."""
        receipt = FrameReceipt() if send.continues is None else None
        plan = ActivationPlan(
            kind="continued",
            task_id=task_id,
            child_id=self._child_id,
            parent=send.parent,
            # The message goes into the turn with the continued activation's first write
            # (before its run could park again), and its sender hears `steered` then.
            prompt=send.message if receipt is not None else (),
            source=send.source,
            signal=CancelSignal(),  # created before the claim, so a kill can never miss it
            label=self._label or "",  # the claimed Task's own, once claimed
            fence=None,
            receipt=receipt,
        )
        if send.recovered is not None:
            # Taken over from a runtime that ended mid-turn: claimed here already.
            snapshot, fence, recovery = send.recovered
            self._ctx.tasks.take_over_parked(snapshot, plan.signal)
            trace = self._ctx.telemetry.activation(
                task_id=task_id,
                child_id=self._child_id,
                route="continued",
                origin=send.origin,
                chars=len(text_of(send.message)),
            )
            update = {"label": snapshot.label, "trace": trace, "fence": fence}
            self._install(plan.model_copy(update={**update, "recovery": recovery}))
            try:
                self._begin()
            except Exception as exc:
                self._fail(BeginActivation(), exc)
            if receipt is not None:
                return Reply(route="steered", task_id=task_id, receipt=receipt)
            return Reply(route="started", task_id=task_id)
        claim = ResumeClaim(send, parked=task_id, checked=checked)
        self._install(plan, claim)
        try:
            self._begin()
        except Exception as exc:
            self._fail(BeginActivation(), exc)
        return Reply(route="held", task_id=task_id, held=claim.held)

    def _resume(self, send: SendMessage) -> Reply:
        """Start the child's next activation for ``send``: its claim (the budget check, then
        a new Task with the child's claim and the message in its turn, in one transaction)
        is an effect its activation runs off this mailbox (`ActivationActor`), not this
        supervisor's store work. The sender waits for the claim's result (``started`` once
        the message is durable, or the refusal); messages sent meanwhile are held."""
        claim = ResumeClaim(send)
        plan = ActivationPlan(
            kind="resumed",
            task_id="",  # the claim names it
            child_id=self._child_id,
            parent=send.parent,
            prompt=send.message,
            source=send.source,
            signal=CancelSignal(),  # created before the Task, so a kill can never miss it
            label=follow_up_label(send.message),
            fence=None,
        )
        self._install(plan, claim)
        # Begun here, not by a message to itself: the activation's loop goes to a waiting
        # worker thread (`actors._pool`), a hand-off as cheap as that message, which the
        # supervisor's loop would only take after this answer anyway. Its failure (no
        # thread left) refuses the claim: nothing was started.
        try:
            self._begin()
        except Exception as exc:
            self._fail(BeginActivation(), exc)
        return Reply(route="held", task_id="", held=claim.held)

    def _install(self, plan: ActivationPlan, claim: ResumeClaim | None = None) -> None:
        """Make ``plan`` this child's current activation, with a fresh record and inbox
        (``claiming`` with a resume's ``claim``, until its activation claimed)."""
        self._label = plan.label or self._label
        if claim is None:
            inbox = self._inbox_for(plan)
        else:
            # Nothing goes into a claiming record's inbox (what comes is held until the
            # claim's result): a stand-in, on no signal of the Task's, so that nothing
            # keeps it once the claimed Task's inbox replaces it (`make_inbox`).
            inbox = self._inbox_for(plan.model_copy(update={"signal": CancelSignal()}))
        current = Activation(
            plan=plan,
            inbox=inbox,
            agent_mark=self._ctx.agents.last_serial(),
            slot=self._slot,
            phase="admitted" if claim is None else "claiming",
            claim=claim,
        )
        self._current = current
        current.publish_view()

    def _inbox_for(self, plan: ActivationPlan) -> ActivationInbox:
        """A fresh inbox for the messages that steer ``plan``'s turn."""
        return ActivationInbox(
            plan.child_id,
            plan.task_id,
            signal=plan.signal,
            trace=plan.trace,
            telemetry=self._ctx.telemetry,
            agents=self._ctx.agents,
        )

    def _begin(self) -> None:
        current = self._current
        if current is not None and current.ref is None:
            current.ref = ActivationActor.start(
                self._ctx, current.plan, self.actor_ref, claim=current.claim
            )
