"""The activation actor: one run of a child, bound to one Task and one result.

It owns the Task's producer: begin (load, authorize, fold the descriptor, call the
provider), publish the run to its supervisor, await the result, dispose the run, and only
then record the Task outcome. A resume's claim runs here first, its supervisor's effect
(`ResumeClaim`): its turn frame (``turn/start`` and the message that resumed it) is written
with the claim, before ``started`` is answered, so the activation finds its own open turn
and goes on in it (a frame it must write itself —
a store that did not write it — is written before the provider is called); a new
child's frame is written at publication, with its header. A resume whose provider this
runtime lacks is left, ``queued``, for a runtime that has it (`_await_provider`).

The order of the turn's steps is here; its parts are in their own modules: the claim in
`actors._claim_step`, what the turn is made of before the provider is called in
`actors._turn_preparing`, and how it ends (settled, parked, handed over) in
`actors._turn_endings`.

Its mailbox is blocked for the whole turn on purpose: nothing is ever sent to it;
cancellation reaches it out-of-band through its `CancelSignal`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pykka

from actors._base import Actor
from actors._claim_step import ResumeClaimStep
from actors._outcomes import aborted, error_text, failed
from actors._record import ActivationPhase, ActivationView, view_of
from actors._turn_endings import TurnEndings
from actors._turn_preparing import Elsewhere, HandOver, Prepared, Settle, TurnPreparation
from actors.context import ActorContext
from actors.messages import (
    ActivationEnded,
    ActivationPlan,
    ClaimCommitted,
    Published,
    ResumeClaim,
    Settling,
)
from controlplane.contract import (
    ErrorCode,
    ResumeRequest,
    SubagentControlError,
    SubagentRun,
    TaskStatus,
    TurnGate,
    utcnow,
)

__all__ = ["ActivationActor"]

log = logging.getLogger(__name__)


class ActivationActor(ResumeClaimStep, TurnPreparation, TurnEndings, Actor):
    """Runs one activation from begin to recorded outcome, then stops itself."""

    # Daemon, as every actor here (`actors._base`): a provider that ignores its signal must
    # not keep the process alive after close() gave up waiting for it.
    # A resume starts one of these every time: on a reused thread, it skips a thread start.
    pooled_loop = True

    def __init__(
        self,
        context: ActorContext,
        plan: ActivationPlan,
        supervisor: pykka.ActorRef[Any],
        *,
        claim: ResumeClaim | None = None,
    ) -> None:
        super().__init__()
        self._ctx = context
        self._plan = plan
        self._supervisor = supervisor
        self._claim = claim
        self._loaded = False  # the child was found in the store (a resume got past its load)

    _view: ActivationView
    """Whose turn this is (Task, child, owner, claim: fixed once a resume's claim is in),
    as its supervisor's record shows it: what its approval desk and budget gate read.
    Made on the activation's own thread, not the supervisor's."""

    def on_start(self) -> None:
        # The turn runs here, on the actor's own thread before its loop takes any message,
        # not as a first message to itself: one mailbox round less before the load, on
        # every activation. Nothing is ever sent to this actor, so nothing waits behind it.
        try:
            if self._claim is not None and not self._claimed(self._claim):
                return  # refused: no Task was started
            self._view = view_of(self._plan, "admitted")  # the plan as claimed
            # Store retries deep in the turn's writes name its child and Task.
            with self._ctx.telemetry.scoped(self._plan.child_id, self._plan.task_id):
                self._execute()
        finally:
            if self._plan.receipt is not None:  # a steer it never wrote: not delivered
                self._plan.receipt.resolve(_unwritten(self._plan))
            self.stop()

    def on_receive(self, message: Any) -> Any:
        return None  # never sent anything (cancellation is out-of-band)

    # -- the turn ---------------------------------------------------------------------

    def _execute(self) -> None:
        plan = self._plan
        run: SubagentRun | None = None
        prepared: Prepared | None = None
        published = framed = False
        noticing: TurnGate | None = None  # the gate whose soft notice is due at the end
        try:
            prepared = self._prepare()
            if prepared.header is None:
                # Before any wait for a slot: a queued resume's message is durable while it
                # waits, so whatever ends the wait (a kill, its runtime's death and a
                # takeover or an adoption) finds it in its turn.
                self._write_frame(prepared)
                framed = True
            self._admit(prepared)
            if framed and plan.signal.aborted:
                # The load (or the wait) may have taken long: a kill that came meanwhile
                # wins over the provider, and the turn ends with the message in it.
                raise self._stopped(prepared, framed)
            run = self._call_provider(prepared, framed)
            if plan.signal.aborted:
                # Killed while the provider was starting: never publish a run we must drop.
                raise self._stopped(prepared, framed)
            try:
                with plan.trace.publishing() if not framed else contextlib.nullcontext():
                    frame = [] if framed else prepared.frame
                    prepared.transcript.publish(frame, header=prepared.header)
            except SubagentControlError as exc:
                if plan.signal.cause is ErrorCode.FENCED:  # fenced while publishing
                    raise Settle(aborted(plan.signal)) from exc
                raise Settle(failed(exc.message, exc.code)) from exc
            published = framed = True
            plan.trace.published()
            self._tell(Published(task_id=plan.task_id, run=run, transcript=prepared.transcript))
            result = self._await_result(run)
            if self._handing_over(prepared, result):
                self._hand_over(run, prepared)
                return
            outcome = self._spent(prepared.gate, result)
            if outcome is result:
                noticing = prepared.gate
            # Told before the Task settles (its listeners run then): a send they make must
            # find the record no longer taking messages, and why.
            self._tell(Settling(task_id=plan.task_id, status=outcome.status))
            if outcome.status is TaskStatus.INPUT_REQUIRED:
                self._notice(noticing)
                self._park(run, prepared)
                return
        except HandOver:
            assert prepared is not None  # raised only once the turn's frame is written
            self._hand_over(run, prepared)
            return
        except Settle as settle:
            outcome = settle.outcome
        except Elsewhere as elsewhere:
            if self._await_provider(elsewhere.provider):
                return
            outcome = elsewhere.refusal
        except BaseException as exc:  # escaping, it would stop every actor
            # A bug here must still settle the Task, or its owner would wait forever.
            log.exception("activation %s crashed", plan.task_id)
            outcome = failed(f"internal error: {exc}")
        if run is not None:
            outcome = self._dispose(run, outcome)
        settled_at, persisted = utcnow(), False
        if prepared is not None:
            outcome, persisted = self._end_turn(prepared, outcome, framed, settled_at)
        # After the turn's end: its commit, which may hold the last call's spend, leaves the
        # gate the rows to judge it on without a read of its own.
        self._notice(noticing)
        settled = self._ctx.tasks.settle(plan.task_id, outcome, at=settled_at, persisted=persisted)
        if self._ctx.admission is not None:
            self._ctx.admission.release(plan.task_id)  # the next in line may start now
        plan.trace.end(settled.outcome)
        self._tell(ActivationEnded(task_id=plan.task_id, durable=published or self._loaded))

    def _admit(self, prepared: Prepared) -> None:
        """Wait for a slot under the concurrency limits the child falls under,
        before anything of the turn runs: its Task reads ``queued`` meanwhile. Killed while
        waiting: a new child ends unpublished, nothing written; a resume's turn, whose frame
        was written before the wait, ends with its message in it (`started` was answered:
        it was delivered)."""
        gate = self._ctx.admission
        if gate is None:
            return
        outcome = gate.wait(self._plan, prepared.request.descriptor)
        if outcome is not None:
            raise Settle(outcome)

    def _write_frame(self, prepared: Prepared) -> None:
        """Make a resumed turn's message durable before the provider starts (every
        delivered message is in the transcript): ``started`` was answered, so whatever the
        start does — a kill, a failure — the message is in its turn, closed by its outcome.
        A new child has no transcript until publication, and a failed start leaves none,
        so its frame waits for `publish`.
        """
        receipt = self._plan.receipt
        try:
            with self._plan.trace.publishing():
                prepared.transcript.write_frame(prepared.frame)
        except SubagentControlError as exc:
            if receipt is not None:
                receipt.resolve(exc)
            if exc.code is ErrorCode.FENCED or self._plan.signal.cause is ErrorCode.FENCED:
                raise Settle(aborted(self._plan.signal)) from exc  # interrupted, lease lost
            raise Settle(failed(exc.message, exc.code)) from exc
        if receipt is not None:
            receipt.resolve(None)

    def _call_provider(self, prepared: Prepared, framed: bool) -> SubagentRun:
        signal = self._plan.signal
        try:
            with self._plan.trace.calling_provider(resumed=self._plan.kind == "resumed"):
                if isinstance(prepared.request, ResumeRequest):
                    return prepared.provider.resume(prepared.request, signal)
                return prepared.provider.start(prepared.request, signal)
        except BaseException as exc:  # escaping, it would stop every actor
            if signal.aborted:
                raise self._stopped(prepared, framed) from exc
            code = exc.code if isinstance(exc, SubagentControlError) else None
            raise Settle(failed(error_text(exc), code)) from exc

    def _tell(self, message: ClaimCommitted | Published | Settling | ActivationEnded) -> None:
        try:
            self._supervisor.tell(message)
        except pykka.ActorDeadError:
            # The supervisor is gone (close gave up waiting): the Task ledger hears the
            # activation's end from here, or nobody would release its Task.
            if isinstance(message, ActivationEnded):
                phase: ActivationPhase = "parked" if message.parked else "ended"
                if message.handed_over:
                    phase = "handed_over"
                self._ctx.tasks.on_view(view_of(self._plan, phase))


def _unwritten(plan: ActivationPlan) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {plan.child_id}: its waiting task {plan.task_id} ended before it could take "
        "the message; the message was not delivered; retry it",
        child_id=plan.child_id,
        task_id=plan.task_id,
    )
