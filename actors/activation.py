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

Its mailbox is blocked for the whole turn on purpose: nothing is ever sent to it;
cancellation reaches it out-of-band through its `CancelSignal`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pykka

from actors._answer import NO_ANSWER, answer_of
from actors._base import Actor
from actors._outcomes import aborted, error_text, failed, not_delivered, unrecorded
from actors._parking import ask_here
from actors._record import ActivationPhase, ActivationView, view_of
from actors._spend import TurnSpend
from actors._transcript import ActivationTranscript, message_data, turn_frame
from actors.context import ActorContext
from actors.messages import (
    ActivationEnded,
    ActivationPlan,
    ClaimCommitted,
    ClaimRefused,
    Published,
    Reply,
    ResumeClaim,
    Settling,
)
from controlplane.contract import (
    BUDGET_EXHAUSTED_STATUS,
    ApprovalDesk,
    Budget,
    ChildMeta,
    Descriptor,
    ErrorCode,
    EventKind,
    LoadedSession,
    NewEvent,
    ParkedTask,
    ResumeRequest,
    SessionEvent,
    StartRequest,
    StopReason,
    SubagentControlError,
    SubagentProvider,
    SubagentRun,
    TaskOutcome,
    TaskStatus,
    TurnGate,
    fold_descriptor,
    text_of,
    utcnow,
)

__all__ = ["ActivationActor"]

log = logging.getLogger(__name__)


class _Settle(Exception):
    """Ends the activation early with ``outcome`` (internal control flow)."""

    def __init__(self, outcome: TaskOutcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


class _Elsewhere(Exception):
    """The resumed turn's provider is not in this runtime: its Task is left for one that
    has it (internal control flow); ``refusal`` is the outcome if it cannot be."""

    def __init__(self, provider: str, refusal: TaskOutcome) -> None:
        super().__init__(provider)
        self.provider = provider
        self.refusal = refusal


class _HandOver(Exception):
    """`close` stopped a resumed turn before its run was published: the turn is handed
    over, its Task left ``running`` (internal control flow)."""


@dataclass(slots=True)
class _Prepared:
    provider: SubagentProvider
    request: StartRequest | ResumeRequest
    transcript: ActivationTranscript
    frame: list[NewEvent]
    header: ChildMeta | None
    gate: TurnGate | None


class ActivationActor(Actor):
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

    # -- a resume's claim -------------------------------------------------------------

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

    # -- the turn ---------------------------------------------------------------------

    def _execute(self) -> None:
        plan = self._plan
        run: SubagentRun | None = None
        prepared: _Prepared | None = None
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
                    raise _Settle(aborted(plan.signal)) from exc
                raise _Settle(failed(exc.message, exc.code)) from exc
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
        except _HandOver:
            assert prepared is not None  # raised only once the turn's frame is written
            self._hand_over(run, prepared)
            return
        except _Settle as settle:
            outcome = settle.outcome
        except _Elsewhere as elsewhere:
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

    def _park(self, run: SubagentRun, prepared: _Prepared) -> None:
        """The run parked on an approval request (its desk gave the child's claim up):
        disposed, the turn left open, the Task not settled — it reads ``input_required``
        in the store until the answer continues it, in any runtime."""
        self._dispose_left(run, "parked")
        prepared.transcript.close(None)
        self._leave_task(handed_over=False)

    def _await_provider(self, provider: str) -> bool:
        """Leave the Task for a runtime that has the child's provider: its message is in
        its turn already (written with the claim), so the Task reads ``queued``, naming
        the provider, with the child's claim kept for it and no runtime, until a runtime
        with the provider takes it from its sweep
        (`controlplane.runtime.lease._recovery.Recovery.take_waiting`). Whether it was left
        so (False: the store refused; the Task then fails, its turn closed)."""
        plan = self._plan
        try:
            left = self._ctx.store.await_provider(
                plan.task_id, plan.child_id, self._ctx.runtime_id, provider
            )
        except SubagentControlError as exc:
            log.warning("task %s not left for provider %r: %s", plan.task_id, provider, exc)
            left = False
        if not left:
            return False
        self._tell(Settling(task_id=plan.task_id, status=None))
        self._leave_task(handed_over=True)
        return True

    def _handing_over(self, prepared: _Prepared, outcome: TaskOutcome) -> bool:
        """Whether the run, stopped by `close`, hands its turn over rather than settling:
        its provider can carry a turn on elsewhere."""
        return (
            self._ctx.hands_over
            and outcome.status is TaskStatus.KILLED
            and self._plan.signal.cause is ErrorCode.CLOSED
            and bool(getattr(prepared.provider, "recovers_turns", False))
        )

    def _stopped(self, prepared: _Prepared, framed: bool) -> _Settle | _HandOver:
        """What ends a turn whose signal aborted before its run was published: a resumed
        turn (its message written, ``started`` answered) that `close` stopped is handed over
        like any running turn; anything else (a kill, a new child with nothing written)
        settles as the signal says."""
        outcome = aborted(self._plan.signal)
        if framed and self._handing_over(prepared, outcome):
            return _HandOver()
        return _Settle(outcome)

    def _hand_over(self, run: SubagentRun | None, prepared: _Prepared) -> None:
        """The control plane closed mid-turn: the run (if it started) is stopped and
        disposed, the turn left open and the Task not settled — it stays ``running`` in the
        store, and once this runtime's row is closed (its claims then lapse at once) a live
        runtime with the child's provider recovers it, same Task, same turn (or the next
        to open)."""
        self._tell(Settling(task_id=self._plan.task_id, status=None))
        if run is not None:
            self._dispose_left(run, "handed-over")
        prepared.transcript.close(None)
        self._leave_task(handed_over=True)

    def _dispose_left(self, run: SubagentRun, what: str) -> None:
        """Dispose a run whose turn is left open (parked or handed over), and its child
        agent; a failure is logged, never raised (escaping, it would stop every actor)."""
        plan = self._plan
        try:
            with plan.trace.disposing():
                run.dispose()
        except BaseException:  # escaping, it would stop every actor
            log.exception("the %s run of task %s did not dispose cleanly", what, plan.task_id)
        agent = getattr(run, "local_agent", None)
        if agent is not None and agent.is_live:
            agent.dispose()

    def _leave_task(self, *, handed_over: bool) -> None:
        """The Task is left unsettled for whoever continues its turn (an answer, a runtime
        with its provider, a live runtime after close): it holds no slot here, and the
        supervisor hears the activation ended with its turn durable and open (its Task
        ledger entry then follows the record's view: gone from this runtime)."""
        plan = self._plan
        if self._ctx.admission is not None:
            self._ctx.admission.release(plan.task_id)  # waiting holds no slot
        plan.trace.end(None)
        self._tell(
            ActivationEnded(
                task_id=plan.task_id, durable=True, parked=True, handed_over=handed_over
            )
        )

    def _admit(self, prepared: _Prepared) -> None:
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
            raise _Settle(outcome)

    def _write_frame(self, prepared: _Prepared) -> None:
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
                raise _Settle(aborted(self._plan.signal)) from exc  # interrupted, lease lost
            raise _Settle(failed(exc.message, exc.code)) from exc
        if receipt is not None:
            receipt.resolve(None)

    def _prepare(self) -> _Prepared:
        plan = self._plan
        if plan.kind == "initial":
            return self._prepare_initial()
        return self._prepare_resumed(continued=plan.kind == "continued")

    def _prepare_initial(self) -> _Prepared:
        plan = self._plan
        assert plan.descriptor is not None
        assert plan.depth is not None
        squatter = self._ctx.agents.get(plan.child_id)
        if squatter is not None:
            raise _Settle(failed(_conflict(plan.child_id), ErrorCode.OWNERSHIP_CONFLICT))
        provider = self._provider(plan.descriptor)
        transcript = self._transcript(turn=1, descriptor=plan.descriptor)
        gate = self._gate(plan.descriptor.budget, transcript)
        now = utcnow()
        seed = [
            SessionEvent(seq=i, turn=0, kind=e.kind, data=e.data, source=e.source, created_at=now)
            for i, e in enumerate(plan.seed, start=1)
        ]
        frame = [
            *(NewEvent(kind=e.kind, turn=0, data=e.data, source=e.source) for e in plan.seed),
            *self._frame(transcript),
            NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data=plan.descriptor.to_event_data()),
        ]
        header = ChildMeta(
            child_id=plan.child_id,
            parent_session=plan.parent.session_id,
            depth=plan.depth,
            seed_length=len(seed),
            label=plan.label,
            created_at=plan.created_at,
        )
        request = StartRequest(
            child_id=plan.child_id,
            prompt=list(plan.prompt),
            source=plan.source,
            parent=plan.parent,
            descriptor=plan.descriptor,
            depth=plan.depth,
            transcript=transcript,
            seed=seed,
            gate=gate,
            approvals=self._desk(transcript, plan.descriptor.provider),
            trace=plan.trace,
        )
        return _Prepared(provider, request, transcript, frame, header, gate)

    def _prepare_resumed(self, *, continued: bool) -> _Prepared:
        plan = self._plan
        child = plan.child_id
        try:
            with plan.trace.loading():
                loaded = self._ctx.store.load(child)
        except SubagentControlError as exc:
            raise _Settle(
                failed(f"child {child} is unavailable: {exc.message}", ErrorCode.NOT_RESUMABLE)
            ) from exc
        self._loaded = True
        if loaded.meta.parent_session != plan.parent.session_id:
            raise _Settle(
                failed(
                    f"child {child} belongs to another parent session; only its direct parent "
                    "can continue it",
                    ErrorCode.UNAUTHORIZED,
                )
            )
        last_turn, descriptors = _resume_facts(loaded)
        descriptor = fold_descriptor(descriptors)
        if descriptor is None:
            raise _Settle(
                failed(
                    f"child {child} has no supported descriptor, so it cannot be re-created; "
                    "do not retry",
                    ErrorCode.NOT_RESUMABLE,
                )
            )
        earlier = loaded.own_events
        framed = _own_open_turn(earlier, last_turn, plan.task_id)
        if (
            not continued
            and framed is not None
            and plan.fence is not None
            and descriptor.provider not in self._ctx.providers.names()
        ):
            # Its message is in its turn already (the claim wrote it): a runtime with the
            # provider runs it, rather than a refusal here.
            try:
                self._provider(descriptor)
            except _Settle as refusal:
                raise _Elsewhere(descriptor.provider, refusal.outcome) from None
        provider = self._provider(descriptor)
        open_turn: list[SessionEvent] = []
        if continued:
            if framed is None:
                raise _Settle(
                    failed(f"task {plan.task_id} has no open turn of child {child} to go on in")
                )
            # Parked on an approval request: it goes on in its own open turn, whose
            # events the run reads (its prompt among them), writing no frame.
            earlier, open_turn = earlier[:framed], earlier[framed:]
            last_turn -= 1
        elif framed is not None:
            # This Task wrote its frame before it waited for a slot, and its runtime died:
            # adopted here, it goes on in that turn (its message is in it once).
            earlier, last_turn = earlier[:framed], last_turn - 1
        transcript = self._transcript(turn=last_turn + 1, descriptor=descriptor, earlier=open_turn)
        gate = self._gate(descriptor.budget, transcript)
        # Not validated again: every value is ours and typed, and validating would visit each
        # of a long transcript's events once more (an isinstance each, cold in cache).
        request = ResumeRequest.model_construct(
            child_id=child,
            prompt=list(plan.prompt),
            source=plan.source,
            parent=plan.parent,
            descriptor=descriptor,
            depth=loaded.meta.depth,
            transcript=transcript,
            seed=loaded.seed,
            events=earlier,
            open_turn=open_turn,
            gate=gate,
            approvals=self._desk(transcript, descriptor.provider),
            trace=plan.trace,
        )
        if continued:
            frame = self._steered(transcript)
        else:
            frame = [] if framed is not None else self._frame(transcript)
        return _Prepared(provider, request, transcript, frame, None, gate)

    def _steered(self, transcript: ActivationTranscript) -> list[NewEvent]:
        """A continued turn's frame: the message sent to the parked child, if any, as a
        ``steering/message`` of its open turn (read before the model goes on)."""
        plan = self._plan
        if not plan.prompt:
            return []
        event = NewEvent(
            kind=EventKind.STEERING_MESSAGE,
            turn=transcript.turn,
            data=message_data(plan.prompt),
            source=plan.source,
        )
        return [event]

    def _desk(self, transcript: ActivationTranscript, provider: str) -> ApprovalDesk | None:
        """Where the run asks for approvals, or None without a store for them."""
        approvals = self._ctx.approvals
        if approvals is None:
            return None
        signal = self._plan.signal
        return approvals.desk(self._view, provider=provider, signal=signal, transcript=transcript)

    def _gate(self, own: Budget | None, transcript: ActivationTranscript) -> TurnGate | None:
        """The run's spend gate, or None when the control plane has no budgets."""
        budgets = self._ctx.budgets
        if budgets is None:
            return None
        plan = self._plan
        return _FencedGate(
            budgets.gate(
                self._view,
                label=plan.label,
                own=own,
                held=transcript.held_spend,
                fenced=transcript.fenced_read,
            ),
            transcript,
        )

    def _spent(self, gate: TurnGate | None, outcome: TaskOutcome) -> TaskOutcome:
        """A run its gate stopped fails ``BUDGET_EXHAUSTED``, however its provider reported
        the stop; any other outcome is returned as it is (its gate's notice is due)."""
        if gate is not None and gate.exhausted is not None and outcome.status is TaskStatus.FAILED:
            return failed(f"budget exhausted: {gate.exhausted}", ErrorCode.BUDGET_EXHAUSTED)
        return outcome

    def _notice(self, gate: TurnGate | None) -> None:
        """Send the soft notice the turn's last call may have earned."""
        if gate is None:
            return
        try:
            gate.ended()
        except SubagentControlError as exc:  # a notice is not worth the turn's outcome
            log.warning("budget notice of task %s not sent: %s", self._plan.task_id, exc)

    def _transcript(
        self, *, turn: int, descriptor: Descriptor, earlier: Sequence[SessionEvent] = ()
    ) -> ActivationTranscript:
        plan = self._plan
        fence = None if plan.fence is None else (self._ctx.runtime_id, plan.fence)
        spend = TurnSpend(turn, price=self._ctx.prices.for_descriptor(descriptor), trace=plan.trace)
        spend.earlier(earlier)  # a continued turn's spend so far: the Task's is the whole turn's
        self._ctx.tasks.meter(plan.task_id, lambda: spend.total)
        return ActivationTranscript(
            self._ctx.store,
            plan.child_id,
            turn=turn,
            fence=fence,
            task_id=plan.task_id,
            signal=plan.signal,
            spend=spend,
        )

    def _frame(self, transcript: ActivationTranscript) -> list[NewEvent]:
        plan = self._plan
        return turn_frame(
            transcript.turn,
            task_id=plan.task_id,
            kind=plan.kind,
            label=plan.label,
            prompt=plan.prompt,
            source=plan.source,
        )

    def _provider(self, descriptor: Descriptor) -> SubagentProvider:
        self._plan.trace.describe(descriptor)
        try:
            return self._ctx.providers.get(descriptor.provider)
        except SubagentControlError as exc:
            raise _Settle(failed(exc.message, exc.code)) from exc

    def _call_provider(self, prepared: _Prepared, framed: bool) -> SubagentRun:
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
            raise _Settle(failed(error_text(exc), code)) from exc

    def _await_result(self, run: SubagentRun) -> TaskOutcome:
        try:
            result = run.result()
        except BaseException as exc:  # escaping, it would stop every actor
            if self._plan.signal.cause is not None:  # the control plane stopped the turn
                return aborted(self._plan.signal)
            return failed(error_text(exc))
        reason = str(result.stop_reason)
        if reason == StopReason.COMPLETED:
            return TaskOutcome(status=TaskStatus.COMPLETED, output=text_of(result.output))
        if reason == StopReason.ABORTED:
            return aborted(self._plan.signal)
        if reason == StopReason.INPUT_REQUIRED:
            return TaskOutcome(status=TaskStatus.INPUT_REQUIRED)  # parked (see `_park`)
        return failed(reason)

    def _dispose(self, run: SubagentRun, outcome: TaskOutcome) -> TaskOutcome:
        try:
            with self._plan.trace.disposing():
                run.dispose()
        except BaseException as exc:  # escaping, it would stop every actor
            earlier = outcome.detail or outcome.status.value
            outcome = failed(f"{earlier}; dispose failed: {error_text(exc)}")
        # A terminal Task leaves the durable child but no live child agent.
        agent = getattr(run, "local_agent", None)
        if agent is not None and agent.is_live:
            agent.dispose()
        return outcome

    def _end_turn(
        self,
        prepared: _Prepared,
        outcome: TaskOutcome,
        framed: bool,
        settled_at: datetime,
    ) -> tuple[TaskOutcome, bool]:
        """Close the turn: ``turn/end`` and the Task's settlement in one transaction.
        Returns the outcome and whether the settlement was written with it.

        A store that could not take the end (down longer than its retry budget) ends the
        Task ``interrupted`` (an outage may end running Tasks
        interrupted, never more); its claim stays held, and the settlement the Task
        service writes once the store is back closes the turn with it (``turn/end``
        status ``interrupted``), so no later turn begins on top of an open one."""
        task_id = self._plan.task_id
        transcript = prepared.transcript
        if not framed:
            transcript.close(None)
            return outcome, False
        status = outcome.status.value
        if outcome.code is ErrorCode.BUDGET_EXHAUSTED:
            status = BUDGET_EXHAUSTED_STATUS
        end = {"task_id": task_id, "status": status}
        # The turn's wall-clock time joins its spend with its end (a `seconds` budget).
        seconds = prepared.gate.elapsed_s() if prepared.gate is not None else 0.0
        try:
            transcript.close(end, settle=(task_id, outcome, settled_at), seconds=seconds)
        except SubagentControlError as exc:
            # Taken over (the new claimant settled it), or fenced by the lease watchdog
            # while the end was being written (the runtime writes it once it can).
            if exc.code is ErrorCode.FENCED or self._plan.signal.cause is ErrorCode.FENCED:
                return aborted(self._plan.signal), False
            return unrecorded(outcome, exc), False
        return outcome, True

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


def _resume_facts(loaded: LoadedSession) -> tuple[int, list[SessionEvent]]:
    """The child's highest turn, and its own descriptor events (those after its seed).

    The store's decoder notes both while it builds the events (`SqlStore.load` returns
    them in a list that carries them, ``noted()``): found afterwards, each is a walk over
    every event, cold in cache right after a long load (at 14,000 events the two walks took
    about a tenth as long as the load). Events that do not carry them are walked.
    """
    events = loaded.events
    noted = getattr(events, "noted", None)
    facts = noted() if callable(noted) else None
    if facts is None:
        return loaded.last_turn, loaded.own_events
    last_turn, indexes = facts
    seed = loaded.meta.seed_length
    return last_turn, [events[i] for i in indexes if i >= seed]


def _own_open_turn(events: Sequence[SessionEvent], last_turn: int, task_id: str) -> int | None:
    """Where the child's last turn begins, when it is still open and was opened by
    ``task_id`` (its frame written before a wait its runtime did not live through); None
    otherwise. Reads only the last turn: a closed one ends with its ``turn/end``."""
    if not events or events[-1].kind == EventKind.TURN_END or events[-1].turn != last_turn:
        return None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.turn != last_turn:
            return None
        if event.kind == EventKind.TURN_START:
            data = event.data
            owned = isinstance(data, dict) and data.get("task_id") == task_id
            return index if owned else None
    return None


def _unwritten(plan: ActivationPlan) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {plan.child_id}: its waiting task {plan.task_id} ended before it could take "
        "the message; the message was not delivered; retry it",
        child_id=plan.child_id,
        task_id=plan.task_id,
    )


def _conflict(child_id: str) -> str:
    return (
        f"a live agent already uses the id of child {child_id}; it is never adopted, so the "
        "child cannot run while it lives"
    )


class _FencedGate:
    """A run's spend gate whose store calls are abandoned when the runtime fences the
    activation, as its transcript's writes are (a read on a silent network held the
    activation past the fence, and its Task's `wait`): the gate runs each of them inside
    the transcript's `fenced_read`. A check refuses at once once the activation is fenced;
    one answered from the rows the run's own appends left makes no store call, and is not
    wrapped (each wrap registers the thread for the fence to find, under a lock).
    """

    __slots__ = ("_gate", "_transcript")

    def __init__(self, gate: TurnGate, transcript: ActivationTranscript) -> None:
        self._gate = gate
        self._transcript = transcript

    def check(self, call: str) -> None:
        self._transcript.refuse_if_fenced()
        self._gate.check(call)

    @property
    def exhausted(self) -> str | None:
        return self._gate.exhausted

    def elapsed_s(self) -> float:
        return self._gate.elapsed_s()

    def ended(self) -> None:
        self._transcript.refuse_if_fenced()
        self._gate.ended()
