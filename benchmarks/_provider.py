"""A minimal `SubagentProvider` for the benchmarks: it costs (almost) nothing itself.

``start``/``resume`` return a run at once; ``steer`` appends to a list; ``result()`` blocks
until the benchmark releases the run (or the activation's signal aborts, so `close` never
waits on it). ``resume`` records `time.perf_counter` on entry, which is where a resume's
latency stops: the provider has been handed the rebuilt child.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from controlplane import (
    AgentHandle,
    CancelSignal,
    MessageSource,
    ResumeRequest,
    StartRequest,
    SubagentResult,
    TextBlock,
)

__all__ = ["BenchProvider", "BenchRun", "HeldStartProvider"]

PROVIDER_NAME = "bench"


class BenchRun:
    """One activation's run; ``result()`` returns once `release` is called."""

    def __init__(self, child_id: str, signal: CancelSignal) -> None:
        self.child_id = child_id
        self.local_agent: AgentHandle | None = None
        self.steered: list[Sequence[TextBlock]] = []
        self._done = threading.Event()
        self.steer: Callable[[Sequence[TextBlock], MessageSource], None] | None = self._steer
        signal.add_callback(lambda _reason: self._done.set())

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        if self._done.is_set():
            raise RuntimeError("the turn has ended")
        self.steered.append(message)

    def release(self) -> None:
        """Let ``result()`` return: the turn completes."""
        self._done.set()

    def result(self) -> SubagentResult:
        """Block until released (or aborted), then complete."""
        self._done.wait()
        return SubagentResult(stop_reason="completed", output=[TextBlock(text="ok")])

    def dispose(self) -> None:
        """Nothing to release beyond unblocking ``result()``."""
        self._done.set()


class BenchProvider:
    """Starts and resumes `BenchRun` s and remembers when each resume was called."""

    name = PROVIDER_NAME

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.runs: dict[str, BenchRun] = {}
        self._resumed: dict[str, tuple[float, BenchRun, ResumeRequest]] = {}

    def start(self, request: StartRequest, signal: CancelSignal) -> BenchRun:
        """A run for a new child, at once."""
        run = BenchRun(request.child_id, signal)
        with self._lock:
            self.runs[request.child_id] = run
        return run

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> BenchRun:
        """A run for a resumed child; records the moment it was called."""
        called = time.perf_counter()
        run = BenchRun(request.child_id, signal)
        with self._lock:
            self.runs[request.child_id] = run
            self._resumed[request.child_id] = (called, run, request)
            self._lock.notify_all()
        return run

    def wait_resumed(
        self, child_id: str, timeout_s: float = 60.0
    ) -> tuple[float, BenchRun, ResumeRequest]:
        """When ``resume`` was called for ``child_id`` (and forget it), with its run."""
        with self._lock:
            if not self._lock.wait_for(lambda: child_id in self._resumed, timeout_s):
                raise TimeoutError(f"provider.resume was not called for {child_id}")
            return self._resumed.pop(child_id)

    def release_all(self) -> None:
        """Let every run's turn complete."""
        with self._lock:
            runs = list(self.runs.values())
        for run in runs:
            run.release()


class HeldStartProvider(BenchProvider):
    """A `BenchProvider` whose ``start`` waits for `let_one_start` (or the activation's
    cancellation): a front's start is answered before its activation publishes, which
    tells the front's own cost from that of the publication running beside it."""

    name = "bench-held"

    def __init__(self) -> None:
        super().__init__()
        self._permits = threading.Semaphore(0)

    def let_one_start(self) -> None:
        """Let one waiting (or the next) ``start`` go on."""
        self._permits.release()

    def start(self, request: StartRequest, signal: CancelSignal) -> BenchRun:
        """A run for a new child, once a start is let go."""
        deadline = time.monotonic() + _HELD_S
        while not self._permits.acquire(timeout=0.01):
            if signal.aborted:
                raise RuntimeError("the held start was cancelled")
            if time.monotonic() > deadline:
                raise RuntimeError("a held start was never let go")
        return super().start(request, signal)


_HELD_S = 60.0
"""The longest a held start waits for the benchmark."""
