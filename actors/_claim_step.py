"""A resume's claim, run by its activation before the turn (its supervisor's effect,
`ResumeClaim`): a resume's new Task admitted with the child's claim and the message in its
turn, or a parked Task claimed for this runtime; claimed, the sender hears ``started`` (or
``steered``), refused, its supervisor hears why. Apart from the turn because it runs
before any Task of this activation exists, and ends in an answer rather than an outcome.
"""

from __future__ import annotations

import logging
from typing import Any

import pykka

from actors._activation_part import ActivationPart
from actors._answer import NO_ANSWER, answer_of
from actors._outcomes import error_text, not_delivered
from actors._parking import ask_here
from actors._transcript import turn_frame
from actors.messages import (
    ActivationPlan,
    ClaimCommitted,
    ClaimRefused,
    Reply,
    ResumeClaim,
)
from controlplane.contract import (
    ErrorCode,
    ParkedTask,
    SubagentControlError,
    text_of,
)

__all__ = ["ResumeClaimStep"]

log = logging.getLogger(__name__)


class ResumeClaimStep(ActivationPart):
    """The claim half of `actors.activation.ActivationActor`, which holds the state named
    here (set in its ``__init__``)."""

    _supervisor: pykka.ActorRef[Any]

    def _claimed(self, claim: ResumeClaim) -> bool:
        """Run the claim, its supervisor's effect: a resume's (the budget check, then the
        new Task admitted with the child's claim and the message in its turn, in one
        transaction) or a parked Task's continuation's (the budget check, then the parked
        Task claimed for this runtime). Claimed: the sender hears ``started`` (or
        ``steered``, once the continued turn took its message) and the turn goes on here;
        refused: the supervisor hears why (`ClaimRefused`) and answers the sender, nothing
        started."""
        plan, send, ctx = self._plan, claim.send, self._ctx
        child_id = plan.child_id
        try:
            if plan.signal.aborted:  # its supervisor stopped (or failed) first
                raise not_delivered(child_id, None, plan.signal.reason or "it was stopped")
            if ctx.budgets is not None and send.continues is None and not claim.checked:
                # A child with a limit reached could not run its next turn: refused before
                # any Task is claimed (BUDGET_EXHAUSTED, nothing delivered).
                ctx.budgets.check_resume(child_id)
            if claim.parked is not None:
                claimed = self._claim_parked(claim, claim.parked)
                if claimed is None:
                    # Its message went into the parked turn in the store, its sender
                    # answered: no activation here; the supervisor decides what it held.
                    why = "its message went into the waiting task's turn in the store"
                    self._refused(claim, not_delivered(child_id, claim.parked, why))
                    return False
            else:
                claimed = self._claim_resume(claim)
        except SubagentControlError as exc:
            self._refused(claim, exc)
            return False
        except Exception as exc:
            log.exception("the claim of child %s failed", child_id)
            error = SubagentControlError(
                ErrorCode.INTERNAL,
                f"internal error while claiming child {child_id} ({error_text(exc)}); the "
                "message was not delivered; retry it",
                child_id=child_id,
            )
            self._refused(claim, error)
            return False
        self._plan = claimed
        if claim.claimed(claimed):
            self._tell(ClaimCommitted(claim=claim))  # its held messages go into the turn
        if claimed.receipt is not None:
            answer = Reply(route="steered", task_id=claimed.task_id, receipt=claimed.receipt)
        else:
            answer = Reply(route="started", task_id=claimed.task_id)
        claim.held.resolve(answer)
        return True

    def _claim_resume(self, claim: ResumeClaim) -> ActivationPlan:
        """The resume's new Task, admitted with the child's claim and the message in its
        turn: the claimed activation's plan."""
        plan, send, ctx = self._plan, claim.send, self._ctx
        child_id = plan.child_id
        # Claimed with its Task: no second activation, in any runtime.
        task, fence = ctx.tasks.claim(
            label=plan.label,
            owner=send.parent,
            child_id=child_id,
            signal=plan.signal,
            # The message is written with the claim, in its transaction: durable before
            # the sender hears ``started``, and the activation goes on in that turn.
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
            queued=ctx.admission is not None,
        )
        try:
            trace = ctx.telemetry.activation(
                task_id=task.id,
                child_id=child_id,
                route="resumed",
                origin=send.origin,
                chars=len(text_of(send.message)),
            )
            return plan.model_copy(
                update={
                    "task_id": task.id,
                    "label": task.label,
                    "trace": trace,
                    "fence": fence,
                }
            )
        except Exception as exc:
            ctx.tasks.discard(task.id)  # never admitted: no Task is left behind
            log.exception("the resume of child %s failed after its claim", child_id)
            raise not_delivered(child_id, None, f"internal error: {exc}") from exc

    def _claim_parked(self, claim: ResumeClaim, task_id: str) -> ActivationPlan | None:
        """The parked Task ``task_id`` claimed for this runtime: the continued activation's
        plan. None: no provider here (a console, a front), its message was written into
        the parked turn, durably, for the runtime that continues the Task (it has the
        provider) to read there; the sender was answered ``steered``."""
        plan, send, ctx = self._plan, claim.send, self._ctx
        child_id = plan.child_id
        approvals = ctx.approvals
        try:
            claimed = approvals.claim_parked(task_id, child_id) if approvals else None
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.UNKNOWN_PROVIDER or approvals is None:
                raise
            if send.continues is not None or not send.message:
                raise
            if not approvals.steer_parked(task_id, child_id, send.message, send.source):
                raise not_delivered(
                    child_id, task_id, "its waiting task went on meanwhile"
                ) from exc
            claim.held.resolve(Reply(route="steered", task_id=task_id))
            return None
        if claimed is None:
            raise not_delivered(
                child_id, task_id, "its waiting task is being continued by another runtime"
            )
        snapshot, fence = claimed
        if send.continues is None and snapshot.owner_session != send.parent.session_id:
            raise SubagentControlError(
                ErrorCode.UNAUTHORIZED,
                f"child {child_id} belongs to another parent session; only its direct "
                "parent can send it messages; the message was not delivered",
                child_id=child_id,
            )
        ctx.tasks.take_over_parked(snapshot, plan.signal)
        trace = ctx.telemetry.activation(
            task_id=task_id,
            child_id=child_id,
            route="continued",
            origin=send.origin,
            chars=len(text_of(send.message)),
        )
        return plan.model_copy(update={"label": snapshot.label, "trace": trace, "fence": fence})

    def _refused(self, claim: ResumeClaim, error: SubagentControlError) -> None:
        """The claim was refused: its supervisor answers the sender and decides what it
        held; or, gone (or no longer on this claim), the sender hears the refusal here (a
        parked Task's as not delivered: sent again, it goes on in that Task)."""
        try:
            taken = answer_of(ask_here(self._supervisor, ClaimRefused(claim=claim, error=error)))
        except Exception:
            taken = NO_ANSWER
        if taken is not True:
            if isinstance(error, ParkedTask):
                error = not_delivered(self._plan.child_id, None, "its supervisor stopped")
            claim.held.resolve(None, error)
