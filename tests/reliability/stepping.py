"""A `SubagentProvider` for race tests whose runs advance by ticks, never by time.

Every child has a step counter on a shared `Clock`. The load generator ticks a child after
each thing it does to it; a provider call waits for a few ticks of its child at each phase:

- starting: ``start``/``resume`` wait 0-3 ticks before returning the run (messages sent
  meanwhile are held by the control plane until publication);
- running: ``result()`` takes 1-8 steps, one tick each, writing an ``assistant/message`` per
  step through the activation's transcript writer, and accepts ``steer`` until it settles;
- settling: ``dispose()`` waits 0-2 ticks after the result (steers then are refused).

How many ticks each phase takes, and how each run ends (mostly ``completed``, sometimes a
non-completed stop reason or a raising ``result()``), comes from a `random.Random` seeded with
the test's seed, the child and the activation number, so a seed names one workload.

``max_live`` records, per child, the most activations live at one instant, counted under
one lock from entering ``start``/``resume`` to the end of ``dispose`` (or the rollback of a
cancelled start): the "at most one activation per child" probe.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Literal

from controlplane import (
    CancelSignal,
    ErrorCode,
    EventKind,
    ResumeRequest,
    StartRequest,
    SubagentControlError,
    SubagentResult,
    TextBlock,
)
from controlplane.contract import TranscriptWriter
from tests.reliability.runs import SettlingRun, SymmetricProvider

__all__ = ["Clock", "Phase", "SteppingProvider", "SteppingRun"]

Phase = Literal["idle", "starting", "running", "settling"]

# A wait that no tick ever ends must fail the test, not hang it.
STALL_LIMIT_S = 30.0


class Clock:
    """Per-child step counters the provider waits on; `drain` ends every wait."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ticks: dict[str, int] = {}
        self._draining = False

    def tick(self, child_id: str) -> None:
        """Advance ``child_id`` one step."""
        with self._cond:
            self._ticks[child_id] = self._ticks.get(child_id, 0) + 1
            self._cond.notify_all()

    def tick_all(self) -> None:
        """Advance every child one step."""
        with self._cond:
            for child_id in list(self._ticks):
                self._ticks[child_id] += 1
            self._cond.notify_all()

    def drain(self) -> None:
        """From now on every wait returns at once (the load is over; let everything settle)."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def wake(self, _reason: str = "") -> None:
        """Re-check every wait (a cancel signal fired)."""
        with self._cond:
            self._cond.notify_all()

    def wait_steps(self, child_id: str, steps: int, signal: CancelSignal | None) -> bool:
        """Wait until ``child_id`` advanced ``steps`` ticks; False if ``signal`` aborted first."""
        if signal is not None:
            # Outside the condition: add_callback runs wake() at once on an aborted signal.
            signal.add_callback(self.wake)
        deadline = time.monotonic() + STALL_LIMIT_S
        with self._cond:
            self._ticks.setdefault(child_id, 0)
            target = self._ticks[child_id] + steps
            while True:
                if signal is not None and signal.aborted:
                    return False
                if self._draining or self._ticks[child_id] >= target:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"child {child_id} stalled: no tick for {STALL_LIMIT_S}s")
                self._cond.wait(left)


@dataclass(frozen=True, slots=True)
class _Fate:
    start_ticks: int
    steps: int
    dispose_ticks: int
    ending: Literal["completed", "max-tokens", "raise"]


class SteppingRun(SettlingRun):
    """One activation of a `SteppingProvider` child."""

    def __init__(
        self,
        provider: SteppingProvider,
        child_id: str,
        fate: _Fate,
        signal: CancelSignal,
        transcript: TranscriptWriter,
    ) -> None:
        super().__init__(child_id)
        self._provider = provider
        self._fate = fate
        self._signal = signal
        self._transcript = transcript
        self._disposed = False

    def result(self) -> SubagentResult:
        """Take the run's steps (one tick each), then end as its fate says."""
        clock = self._provider.clock
        aborted = False
        for step in range(self._fate.steps):
            if not clock.wait_steps(self.child_id, 1, self._signal):
                aborted = True
                break
            self._transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": f"step {step}"})
        self._settle()
        self._provider._set_phase(self.child_id, "settling")
        if aborted or self._signal.aborted:
            return SubagentResult(stop_reason="aborted")
        if self._fate.ending == "raise":
            raise RuntimeError(f"stepping run of {self.child_id} failed on purpose")
        if self._fate.ending == "max-tokens":
            return SubagentResult(stop_reason="max-tokens")
        return SubagentResult(stop_reason="completed", output=[TextBlock(text="stepped")])

    def dispose(self) -> None:
        """Take the settling ticks, then leave (the run is quiescent after this)."""
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            self._settled = True
        self._provider._set_phase(self.child_id, "settling")
        # A cancelled run is quiescent once disposed, whatever the rest of the load does:
        # its settling ticks come from other threads of its process (senders), which a
        # partition may hold in store calls for the store's whole deadline, and a dispose
        # waiting on them kept a fenced activation alive past its lease.
        self._provider.clock.wait_steps(self.child_id, self._fate.dispose_ticks, self._signal)
        self._provider._leave(self.child_id)


class SteppingProvider(SymmetricProvider[SteppingRun]):
    """A thread-safe `SubagentProvider` driven by a `Clock` (see the module docstring)."""

    def __init__(self, clock: Clock, *, seed: int, name: str = "stepping") -> None:
        super().__init__(name)
        self.clock = clock
        self._seed = seed
        self._lock = threading.Lock()
        self._live: dict[str, int] = {}
        self._activations: dict[str, int] = {}
        # Children are numbered in the order they first start, so a seed names one workload
        # even though child ids are random UUIDs.
        self._index: dict[str, int] = {}
        self._phase: dict[str, Phase] = {}
        self.max_live: dict[str, int] = {}
        self.rollbacks = 0
        self.entered = 0

    def live_total(self) -> int:
        """How many activations of any child are live right now."""
        with self._lock:
            return sum(self._live.values())

    def phase(self, child_id: str) -> Phase:
        """What the child's activation is doing right now, as the provider sees it."""
        with self._lock:
            return self._phase.get(child_id, "idle")

    def _begin(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> SteppingRun:
        """Enter, wait the starting ticks (or roll back on abort), return the run."""
        child_id = request.child_id
        fate = self._enter(child_id)
        try:
            if not self.clock.wait_steps(child_id, fate.start_ticks, signal):
                raise SubagentControlError(
                    ErrorCode.CANCELLED,
                    f"stepping start of {child_id} cancelled: {signal.reason}",
                    child_id=child_id,
                )
            # Held until publication, then written right after the frame in the same batch.
            request.transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "warming up"})
        except BaseException:
            with self._lock:
                self.rollbacks += 1
            self._leave(child_id)
            raise
        self._set_phase(child_id, "running")
        return SteppingRun(self, child_id, fate, signal, request.transcript)

    def _enter(self, child_id: str) -> _Fate:
        with self._lock:
            live = self._live.get(child_id, 0) + 1
            self._live[child_id] = live
            self.max_live[child_id] = max(self.max_live.get(child_id, 0), live)
            number = self._activations.get(child_id, 0) + 1
            self._activations[child_id] = number
            index = self._index.setdefault(child_id, len(self._index))
            self._phase[child_id] = "starting"
            self.entered += 1
        rng = random.Random(f"{self._seed}:{index}:{number}")
        roll = rng.random()
        ending: Literal["completed", "max-tokens", "raise"] = (
            "raise" if roll < 0.05 else "max-tokens" if roll < 0.12 else "completed"
        )
        return _Fate(
            start_ticks=rng.randint(0, 3),
            steps=rng.randint(1, 8),
            dispose_ticks=rng.randint(0, 2),
            ending=ending,
        )

    def _leave(self, child_id: str) -> None:
        with self._lock:
            self._live[child_id] -= 1
            if self._live[child_id] == 0:
                self._phase[child_id] = "idle"

    def _set_phase(self, child_id: str, phase: Phase) -> None:
        with self._lock:
            if self._live.get(child_id, 0) > 0:
                self._phase[child_id] = phase
