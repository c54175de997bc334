"""How an activation's turn ends (`actors.activation.ActivationActor`): the run's result
read, the run disposed, ``turn/end`` and the Task's settlement written in one transaction;
or the turn left open and the Task unsettled — parked on an approval, handed over when
`close` stopped it, or left ``queued`` for a runtime with the child's provider. Apart from
the turn's start because ending is the part that must hold whatever the start did.
"""

from __future__ import annotations

import logging
from datetime import datetime

from actors._activation_part import ActivationPart
from actors._outcomes import aborted, error_text, failed, unrecorded
from actors._turn_preparing import HandOver, Prepared, Settle
from actors.messages import (
    ActivationEnded,
    Settling,
)
from controlplane.contract import (
    BUDGET_EXHAUSTED_STATUS,
    ErrorCode,
    StopReason,
    SubagentControlError,
    SubagentRun,
    TaskOutcome,
    TaskStatus,
    TurnGate,
    text_of,
)

__all__ = ["TurnEndings"]

log = logging.getLogger(__name__)


class TurnEndings(ActivationPart):
    """The ending half of `actors.activation.ActivationActor`, which holds the state named
    here (set in its ``__init__``)."""

    def _park(self, run: SubagentRun, prepared: Prepared) -> None:
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

    def _handing_over(self, prepared: Prepared, outcome: TaskOutcome) -> bool:
        """Whether the run, stopped by `close`, hands its turn over rather than settling:
        its provider can carry a turn on elsewhere."""
        return (
            self._ctx.hands_over
            and outcome.status is TaskStatus.KILLED
            and self._plan.signal.cause is ErrorCode.CLOSED
            and bool(getattr(prepared.provider, "recovers_turns", False))
        )

    def _stopped(self, prepared: Prepared, framed: bool) -> Settle | HandOver:
        """What ends a turn whose signal aborted before its run was published: a resumed
        turn (its message written, ``started`` answered) that `close` stopped is handed over
        like any running turn; anything else (a kill, a new child with nothing written)
        settles as the signal says."""
        outcome = aborted(self._plan.signal)
        if framed and self._handing_over(prepared, outcome):
            return HandOver()
        return Settle(outcome)

    def _hand_over(self, run: SubagentRun | None, prepared: Prepared) -> None:
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
        prepared: Prepared,
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
