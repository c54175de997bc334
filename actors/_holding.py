"""The supervisor's side of its activation's record: the activation's reports (claimed or
refused, published, settling, ended) fed to the record's state machine, the effects it
returns run in order, and the messages held while a resume's claim runs or a run parks,
delivered once the claim's result is in (into the claimed turn, or the parked Task's) or
the run has parked (into the parked Task's continued turn), or decided afresh.

A mixin of `actors.supervisor.ChildSupervisor`: it runs on the supervisor's thread, in its
mailbox order, and reads and writes the supervisor's own fields.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from actors._inbox import ActivationInbox, Held
from actors._outcomes import error_text, not_delivered
from actors._record import (
    Activation,
    ActivationEvent,
    ActivationSlot,
    ActivationView,
    Claimed,
    ClaimFailed,
    MessageHeld,
    Parking,
    RunEnded,
    RunPublished,
    RunSettling,
)
from actors.messages import (
    ActivationEnded,
    ActivationPlan,
    ClaimCommitted,
    ClaimRefused,
    Published,
    Reply,
    SendMessage,
    Settling,
)
from controlplane.contract import ErrorCode, ParkedTask, SubagentControlError, TaskStatus

if TYPE_CHECKING:
    from actors.context import ActorContext

__all__ = ["MessageHolding"]


class MessageHolding:
    """The supervisor's record side: `_on_published`, `_on_settling`, `_on_ended`,
    `_apply`, `_parking`, `_hold`, `_deliver_held`, `_drop`, `_close_inbox`."""

    if TYPE_CHECKING:  # the supervisor's fields and methods these use
        _ctx: ActorContext
        _child_id: str
        _slot: ActivationSlot
        _current: Activation | None
        _parent_session: str | None

        def _fail(self, message: Any, exc: BaseException) -> SubagentControlError | None: ...

        def _retire(self) -> None: ...

        _label: str | None

        def _squatter(self, current: Activation | None) -> SubagentControlError | None: ...

        def _on_send(self, send: SendMessage) -> Reply: ...

        def _continue(self, send: SendMessage, task_id: str, *, checked: bool = False) -> Reply: ...

        def _inbox_for(self, plan: ActivationPlan) -> ActivationInbox: ...

    def _reports(self, current: Activation | None, task_id: str) -> bool:
        """Whether a report about ``task_id`` is ``current``'s. A claiming record learns
        here that its claim committed: the activation set the claimed plan before its
        first report, so that report brings `Claimed` in, ahead of itself (no message of
        its own)."""
        if current is None:
            return False
        claimed = current.claim.plan if current.claim is not None else None
        if current.phase == "claiming" and claimed is not None and claimed.task_id == task_id:
            self._apply(current, Claimed(claimed))
        return current.phase != "claiming" and current.task_id == task_id

    def _on_claim_committed(self, committed: ClaimCommitted) -> None:
        """The resume's claim committed while messages were held for it: they go on now."""
        current = self._current
        claimed = committed.claim.plan
        if current is not None and current.claim is committed.claim and claimed is not None:
            self._reports(current, claimed.task_id)

    def _on_claim_refused(self, refused: ClaimRefused) -> bool:
        """The resume's claim was refused: the record's result. Whether this supervisor
        took the claim's sender over (False: not its record's claim any more)."""
        current = self._current
        if current is None or current.claim is not refused.claim or current.phase != "claiming":
            return False
        self._apply(current, ClaimFailed(refused.error))
        if refused.error.code is ErrorCode.CHILD_NOT_FOUND or current.broken is not None:
            # Not in the store: nothing here to keep a thread for (or it broke meanwhile).
            self._retire()
        return True

    def _on_published(self, published: Published) -> None:
        current = self._current
        if not self._reports(current, published.task_id):
            return
        assert current is not None
        self._apply(current, RunPublished(published.run, published.transcript))
        self._parent_session = current.plan.parent.session_id  # authorized by now

    def _on_settling(self, settling: Settling) -> None:
        current = self._current
        if self._reports(current, settling.task_id):
            assert current is not None
            self._apply(current, RunSettling(settling.status))

    def _on_ended(self, ended: ActivationEnded) -> None:
        current = self._current
        broken: str | None = None
        if self._reports(current, ended.task_id):
            assert current is not None
            broken = current.broken
            self._apply(current, RunEnded(_how(ended)))
        else:
            # Not the current record's (its supervisor stopped it, or failed first): only
            # now, with the association gone, may `tasks.wait()` return.
            self._ctx.tasks.on_view(_final(ended))
        if (not ended.durable or ended.parked or broken is not None) and self._current is None:
            # A parked child waits in the store, holding no thread here: not even this
            # supervisor's (its answer or its next message makes a new one, anywhere).
            self._retire()

    def _apply(self, current: Activation, event: ActivationEvent) -> None:
        """Feed ``event`` to ``current``'s state machine and run the effects it returns,
        in order."""
        handed: list[Held] = []
        parked: str | None = None
        claim = current.claim
        effects = current.apply(event)
        if current.phase != "published":
            # Moved on (or not yet published): every later send is this supervisor's to
            # decide, before any effect of this step runs.
            current.inbox.stop_direct()
        for effect in effects:
            if effect == "open_inbox":
                # Held messages passed the ownership check on a guess (an agent registered
                # after the activation began may be the run's); now the run says which
                # agent is its own. Their senders deliver them now, in order.
                squatter = self._squatter(current)
                current.inbox.publish(current.view(), squatter)
            elif effect == "hand_back" and current.broken is None:
                # The messages its run did not take, then those held while it parked: all
                # go into the parked Task's continued turn, in that order.
                handed = [*current.inbox.hand_back(current.view()), *current.held]
                current.held.clear()
                parked = current.task_id
            elif effect == "redecide" and current.broken is None:
                # It ended without parking: each held message is decided afresh, as if it
                # came now (a resume, or the parked Task's continuation the store names).
                handed = list(current.held)
                current.held.clear()
            elif effect == "make_inbox":
                self._label = current.plan.label or self._label  # the claimed Task's
                current.inbox = self._inbox_for(current.plan)
                if current.broken is not None:
                    current.inbox.close(ErrorCode.NOT_DELIVERED, current.broken)
            elif effect == "release_held" and current.broken is None:
                # Claimed: each held message is decided afresh, now steered into its turn.
                handed = list(current.held)
                current.held.clear()
            elif effect == "refuse_claim":
                assert claim is not None
                assert isinstance(event, ClaimFailed)
                claim.held.resolve(None, _claim_refusal(self._child_id, event.error))
            elif effect == "refuse_held":
                assert isinstance(event, ClaimFailed)
                refusal = _claim_refusal(self._child_id, event.error)
                for message in current.held:
                    message.resolve(None, refusal)
                current.held.clear()
            elif effect == "continue_parked":
                # The child's Task is parked: the resuming message, then those held, go on
                # in its continued turn, in that order.
                assert claim is not None
                assert isinstance(event, ClaimFailed)
                assert isinstance(event.error, ParkedTask)
                if current.broken is None:
                    handed = [claim.held, *current.held]
                    current.held.clear()
                    parked = event.error.parked_task_id
                else:
                    refusal = not_delivered(self._child_id, None, current.broken)
                    claim.held.resolve(None, refusal)
            elif effect == "close_inbox":
                why = current.broken or "the activation ended before it could take the message"
                self._close_inbox(current, ErrorCode.NOT_DELIVERED, why)
            elif effect == "drop":
                self._drop()
            elif effect == "notify_ledger":
                # Ended: only now, with the association gone, may `tasks.wait()` return.
                self._ctx.tasks.on_view(current.view())
        for held in handed:
            # The resuming message passed the budget check with its claim, just now.
            self._deliver_held(held, parked, checked=claim is not None and held is claim.held)

    def _parking(self, current: Activation) -> bool:
        """Whether ``current``'s run is parking on an approval request (its Task goes on
        in a continued turn once it has)."""
        transcript = current.transcript
        if current.phase == "published" and transcript is not None and transcript.parked:
            self._apply(current, Parking())  # its run took the park; its report follows
        return current.phase == "parking"

    def _hold(self, current: Activation, send: SendMessage) -> Reply:
        held = Held(send)
        self._apply(current, MessageHeld(held))
        return Reply(route="held", task_id=current.task_id, held=held)

    def _deliver_held(
        self, held: Held, parked_task_id: str | None, *, checked: bool = False
    ) -> None:
        """Deliver a message held while its child's run parked (or its resume's claim
        ran): into the parked Task's continued turn (the first one starts it; the rest are
        steered into it), or, when the run did not park after all (``parked_task_id``
        None), decided afresh. ``checked``: it passed the budget check already."""
        send = held.send
        try:
            if (
                parked_task_id is not None
                and self._current is None
                and send.forwarded is None
                and send.recovered is None
                and send.continues in (None, parked_task_id)
            ):
                conflict = self._squatter(None)
                if conflict is not None:
                    raise conflict
                # Its budget check (as for any next turn) runs with the claim, off this
                # mailbox, unless it passed one just now.
                reply = self._continue(send, parked_task_id, checked=checked)
            else:
                reply = self._on_send(send)
        except SubagentControlError as exc:
            held.resolve(None, exc)
        except Exception as exc:
            error = self._fail(send, exc)
            why = error or not_delivered(self._child_id, parked_task_id, error_text(exc))
            held.resolve(None, why)
        else:
            held.resolve(reply)

    def _drop(self) -> None:
        """The current activation is gone from this supervisor."""
        self._current = None
        self._slot.view = None

    def _close_inbox(self, current: Activation, code: ErrorCode, why: str) -> None:
        current.inbox.close(code, why)
        refusal = not_delivered(self._child_id, current.task_id, why)
        for message in current.held:
            message.resolve(None, refusal)
        current.held.clear()


def _claim_refusal(child_id: str, error: SubagentControlError) -> SubagentControlError:
    """What the sender of a message whose resume's claim was refused hears."""
    if error.code is ErrorCode.CHILD_NOT_FOUND:
        return SubagentControlError(
            ErrorCode.CHILD_NOT_FOUND,
            f"there is no child {child_id} in the store (a child is stored once its first "
            "run is published); the message was not delivered and no task was started; "
            "check the id",
            child_id=child_id,
        )
    return error


def _final(ended: ActivationEnded) -> ActivationView:
    """The last view of an activation that is no longer this supervisor's record."""
    return ActivationView(
        task_id=ended.task_id,
        child_id="",
        kind="initial",
        owner_session="",
        fence=None,
        status=TaskStatus.RUNNING,
        phase=_how(ended),
        recovery=0,
        published=False,
        settling=True,
        cancel_reason=None,
        started=time.monotonic(),
    )


def _how(ended: ActivationEnded) -> Literal["ended", "parked", "handed_over"]:
    if ended.handed_over:
        return "handed_over"
    return "parked" if ended.parked else "ended"
