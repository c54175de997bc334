"""A scriptable fake `SubagentProvider` for the control-plane tests.

Each ``start``/``resume`` call takes the next queued `Plan` (``provider.plan(...)``, optionally
targeted at one child), else a fresh plan built from the provider's default
(``provider.default_plan(...)``). A plan says what the call does: wait on a start gate (or the
cancel signal, which rolls back and raises ``CANCELLED``), fail, write to the transcript,
register a child agent, and what the run's ``result()``/``steer``/``dispose()`` do.

Everything the control plane does to the provider is recorded: ``starts``/``resumes`` (the
requests), ``steers``, ``disposes``, a shared ordered ``log`` of events a test may append to
(e.g. ``("outcome", task_id)`` from an ``on_done`` listener), and, per child, how many
activations were live at once (``max_live``), which is how the race tests check "at most one
activation per child".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane import (
    AgentHandle,
    CancelSignal,
    ErrorCode,
    MessageSource,
    ResumeRequest,
    StartRequest,
    SubagentControlError,
    SubagentResult,
    TextBlock,
)

__all__ = ["FakeProvider", "FakeRun", "Plan", "Steer"]

# A gate nobody releases must fail the test, not hang the run; pytest-timeout is the backstop.
GATE_LIMIT_S = 30.0
# How often a gated wait also looks at the cancel signal (a threading.Event cannot notify two
# waiters' conditions at once, and the signal is the provider's to watch).
_POLL_S = 0.001

LogEntry = tuple[str, str]


@dataclass(frozen=True)
class Steer:
    """One message the control plane steered into a run."""

    child_id: str
    message: list[TextBlock]
    source: MessageSource

    @property
    def text(self) -> str:
        """The message's text."""
        return "".join(block.text for block in self.message)


@dataclass
class Plan:
    """What one ``start``/``resume`` call does, and what happened to it.

    Attributes:
        start_gate: ``start``/``resume`` blocks until it is set (or the signal aborts).
        result: What ``result()`` returns, or an exception it raises.
        result_gate: ``result()`` blocks until it is set (or the signal aborts -> aborted).
        fail_start: Raised by ``start``/``resume`` (after the start gate).
        fail_dispose: Raised by ``dispose()`` (after releasing everything).
        fail_steer: Raised by ``steer`` instead of accepting the message.
        dispose_gate: ``dispose()`` blocks until it is set (the signal does not open it).
        rollback_gate: A failed or cancelled start blocks in its roll-back until it is set.
        steerable: Whether the run offers ``steer`` (else ``steer is None``).
        writes: ``(kind, data)`` written through ``request.transcript`` before returning.
        local_agent: Register the run's own agent under the child id.
        for_child: Only a call for this child id takes the plan.
    """

    start_gate: threading.Event | None = None
    result: SubagentResult | BaseException | None = None
    result_gate: threading.Event | None = None
    fail_start: BaseException | None = None
    fail_dispose: BaseException | None = None
    fail_steer: BaseException | None = None
    dispose_gate: threading.Event | None = None
    rollback_gate: threading.Event | None = None
    steerable: bool = True
    writes: list[tuple[str, Any]] = field(default_factory=list)
    local_agent: bool = False
    for_child: str | None = None
    # What happened (filled in by the provider):
    kind: str | None = None
    request: StartRequest | ResumeRequest | None = None
    signal: CancelSignal | None = None
    run: FakeRun | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    returned: threading.Event = field(default_factory=threading.Event)
    rolling_back: threading.Event = field(default_factory=threading.Event)
    rolled_back: threading.Event = field(default_factory=threading.Event)
    settled: threading.Event = field(default_factory=threading.Event)
    disposed: threading.Event = field(default_factory=threading.Event)

    def clone(self) -> Plan:
        """A fresh plan with the same script and nothing recorded."""
        return Plan(
            start_gate=self.start_gate,
            result=self.result,
            result_gate=self.result_gate,
            fail_start=self.fail_start,
            fail_dispose=self.fail_dispose,
            fail_steer=self.fail_steer,
            dispose_gate=self.dispose_gate,
            rollback_gate=self.rollback_gate,
            steerable=self.steerable,
            writes=list(self.writes),
            local_agent=self.local_agent,
            for_child=self.for_child,
        )


def completed(text: str = "done") -> SubagentResult:
    """A completed result whose output is ``text``."""
    return SubagentResult(stop_reason="completed", output=[TextBlock(text=text)])


class FakeRun:
    """The run a `FakeProvider` publishes; every method is thread-safe."""

    def __init__(
        self, provider: FakeProvider, plan: Plan, child_id: str, signal: CancelSignal
    ) -> None:
        self._provider = provider
        self._plan = plan
        self._signal = signal
        self._lock = threading.Lock()
        self._settled = False
        self._disposed = False
        self._result: SubagentResult | None = None
        self.child_id = child_id
        self.local_agent: AgentHandle | None = None
        self.steered: list[Steer] = []
        self.dispose_calls = 0
        self.steer: Callable[[Sequence[TextBlock], MessageSource], None] | None = (
            self._steer if plan.steerable else None
        )

    @property
    def is_settled(self) -> bool:
        """Whether ``result()`` has returned or raised."""
        return self._settled

    def result(self) -> SubagentResult:
        """Block on the result gate or the signal; aborted -> ``stop_reason="aborted"``."""
        if self._result is not None:
            return self._result
        opened = _wait_gate(self._plan.result_gate, self._signal)
        outcome: SubagentResult | BaseException
        if not opened:
            outcome = SubagentResult(stop_reason="aborted")
        elif self._plan.result is None:
            outcome = completed()
        else:
            outcome = self._plan.result
        with self._lock:
            # Settle under the lock `steer` takes: a steer either lands before this or raises.
            self._settled = True
        self._provider.record(("result", self.child_id))
        self._plan.settled.set()
        if isinstance(outcome, BaseException):
            raise outcome
        self._result = outcome
        return outcome

    def dispose(self) -> None:
        """Release the run (and its agent); raise ``fail_dispose`` if scripted."""
        if self._plan.dispose_gate is not None and not self._plan.dispose_gate.wait(GATE_LIMIT_S):
            raise RuntimeError("a FakeProvider dispose gate was never released")
        with self._lock:
            first = not self._disposed
            self._disposed = True
            self._settled = True
            self.dispose_calls += 1
        self._provider.record(("dispose", self.child_id))
        with self._provider._lock:
            self._provider.disposes.append(self.child_id)
        if first:
            if self.local_agent is not None:
                self.local_agent.dispose()
            self._provider._leave(self.child_id)
            self._plan.disposed.set()
        if self._plan.fail_dispose is not None:
            raise self._plan.fail_dispose

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        with self._lock:
            if self._settled or self._disposed:
                raise SubagentControlError(
                    ErrorCode.NOT_DELIVERED,
                    f"the fake turn of child {self.child_id} has settled",
                    child_id=self.child_id,
                )
            if self._plan.fail_steer is not None:
                raise self._plan.fail_steer
            steer = Steer(self.child_id, list(message), source)
            self.steered.append(steer)
        with self._provider._lock:
            self._provider.steers.append(steer)
        self._provider.record(("steer", self.child_id))


class FakeProvider:
    """A `SubagentProvider` whose every call is scripted and recorded. Thread-safe."""

    def __init__(self, name: str = "fake") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._queued: list[Plan] = []
        self._default = Plan()
        self._live: dict[str, int] = {}
        self.max_live: dict[str, int] = {}
        self.plans: list[Plan] = []
        self.starts: list[StartRequest] = []
        self.resumes: list[ResumeRequest] = []
        self.steers: list[Steer] = []
        self.disposes: list[str] = []
        self.rollbacks: list[str] = []
        self.log: list[LogEntry] = []

    @property
    def name(self) -> str:
        """The registry key."""
        return self._name

    # Scripting -------------------------------------------------------------------------

    def plan(self, **script: Any) -> Plan:
        """Queue a plan for the next matching ``start``/``resume`` and return it."""
        plan = Plan(**script)
        with self._lock:
            self._queued.append(plan)
        return plan

    def default_plan(self, **script: Any) -> None:
        """Set what an unplanned call does (the default completes with output ``done``)."""
        with self._lock:
            self._default = Plan(**script)

    def record(self, entry: LogEntry) -> None:
        """Append to the shared ordered log."""
        with self._lock:
            self.log.append(entry)

    # Observation ------------------------------------------------------------------------

    def live(self, child_id: str) -> int:
        """How many activations of ``child_id`` are live now (entered, not yet quiescent)."""
        with self._lock:
            return self._live.get(child_id, 0)

    def total_live(self) -> int:
        """How many activations of any child are live now."""
        with self._lock:
            return sum(self._live.values())

    def steered_texts(self, child_id: str | None = None) -> list[str]:
        """The texts steered into runs (of ``child_id`` when given)."""
        with self._lock:
            return [s.text for s in self.steers if child_id is None or s.child_id == child_id]

    def calls_for(self, child_id: str) -> list[Plan]:
        """The plans taken by calls for ``child_id``, in call order."""
        with self._lock:
            return [p for p in self.plans if p.request and p.request.child_id == child_id]

    # SubagentProvider ---------------------------------------------------------------------

    def start(self, request: StartRequest, signal: CancelSignal) -> FakeRun:
        """Start a child as the next plan says."""
        with self._lock:
            self.starts.append(request)
        return self._run("start", request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> FakeRun:
        """Resume a child as the next plan says."""
        with self._lock:
            self.resumes.append(request)
        return self._run("resume", request, signal)

    # Internals ----------------------------------------------------------------------------

    def _take(self, child_id: str) -> Plan:
        with self._lock:
            for i, queued in enumerate(self._queued):
                if queued.for_child in (None, child_id):
                    plan = self._queued.pop(i)
                    break
            else:
                plan = self._default.clone()
            self.plans.append(plan)
            return plan

    def _enter(self, child_id: str) -> None:
        with self._lock:
            live = self._live.get(child_id, 0) + 1
            self._live[child_id] = live
            self.max_live[child_id] = max(self.max_live.get(child_id, 0), live)

    def _leave(self, child_id: str) -> None:
        with self._lock:
            self._live[child_id] -= 1

    def _run(
        self, kind: str, request: StartRequest | ResumeRequest, signal: CancelSignal
    ) -> FakeRun:
        child_id = request.child_id
        plan = self._take(child_id)
        plan.kind, plan.request, plan.signal = kind, request, signal
        self._enter(child_id)
        self.record((kind, child_id))
        plan.entered.set()
        try:
            if not _wait_gate(plan.start_gate, signal):
                raise SubagentControlError(
                    ErrorCode.CANCELLED,
                    f"fake {kind} of child {child_id} cancelled: {signal.reason}",
                    child_id=child_id,
                )
            if plan.fail_start is not None:
                raise plan.fail_start
            for event_kind, data in plan.writes:
                request.transcript.append(event_kind, data)
            run = FakeRun(self, plan, child_id, signal)
            if plan.local_agent:
                run.local_agent = request.parent.registry.register(child_id, depth=request.depth)
        except BaseException:
            # Roll back to quiescence before raising, as the provider contract asks.
            plan.rolling_back.set()
            if plan.rollback_gate is not None and not plan.rollback_gate.wait(GATE_LIMIT_S):
                raise RuntimeError("a FakeProvider rollback gate was never released") from None
            self._leave(child_id)
            with self._lock:
                self.rollbacks.append(child_id)
            self.record(("rollback", child_id))
            plan.rolled_back.set()
            raise
        plan.run = run
        plan.returned.set()
        return run


def _wait_gate(gate: threading.Event | None, signal: CancelSignal) -> bool:
    """Wait for ``gate`` (None = open); False when the signal aborted first."""
    deadline = time.monotonic() + GATE_LIMIT_S
    while not signal.aborted:
        if gate is None or gate.wait(_POLL_S):
            return True
        if time.monotonic() > deadline:
            raise RuntimeError("a FakeProvider gate was never released")
    return False
