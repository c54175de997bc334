"""SPEC §9 durable Tasks: a runtime killed mid-turn is recovered honestly by the next one.

Real OS processes (``restart_child.py``) on both backends: SIGKILL (the process is gone) and
SIGSTOP past the lease (the process lives, its runtime is dead to the others). Every process
a test starts is killed and reaped, pass or fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from persistence import is_expired
from tests.fakes import FakeProvider
from tests.support import WAIT_S, eventually, in_thread

SCRIPT = Path(__file__).with_name("restart_child.py")
REPO = SCRIPT.parents[2]
PARENT = "restart-parent"
READY_S = 45.0
# A lease whose background sweep (every third of it) comes long after any test's timeout.
NO_BACKGROUND_SWEEP_S = 3600.0

pytestmark = pytest.mark.slow


class Child:
    """A running ``restart_child.py`` and what it reported."""

    def __init__(self, url: str, lease_ttl_s: float, *, steer: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), url, str(lease_ttl_s), *(["steer"] if steer else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            text=True,
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        got = threading.Event()
        self.ready: dict[str, str] = {}

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                with self._lock:
                    self._lines.append(line.strip())
                if line.startswith("READY "):
                    self.ready.update(json.loads(line.removeprefix("READY ")))
                    got.set()

        threading.Thread(target=read, daemon=True).start()
        if not got.wait(READY_S):
            self.reap()
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            pytest.fail(f"the child never got ready: {self.lines()!r} {stderr[-3000:]}")

    def lines(self) -> list[str]:
        """What it printed so far."""
        with self._lock:
            return list(self._lines)

    def reap(self) -> None:
        """SIGCONT (in case it is stopped), SIGKILL, and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.reap()


def reopen(url: str, **options: object) -> SubagentControl:
    control = SubagentControl.open(url, **options)  # type: ignore[arg-type]
    control.providers.register(FakeProvider())
    return control


def test_a_task_killed_mid_turn_reads_interrupted_and_its_child_resumes_after_a_closed_turn(
    url: str, children: list[Child]
) -> None:
    child = Child(url, lease_ttl_s=30.0)
    children.append(child)
    ready = child.ready
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(10)

    # Same host, same boot, its process gone: dead at once, not after its 30 s lease, and
    # settled by this runtime as it opens (recovery off: the interrupted path, SPEC §9).
    control = reopen(url, lease_ttl_s=30.0, recover=False)
    try:
        parent = control.agents.register(PARENT)
        running = control.tasks.get(ready["running_task"], requester=parent)
        assert running.status is TaskStatus.INTERRUPTED
        assert running.outcome is not None
        assert "interrupted" in (running.outcome.detail or "")
        assert running.runtime_id == ready["runtime_id"]
        assert running.settled_at is not None
        finished = control.tasks.get(ready["done_task"], requester=parent)
        assert finished.status is TaskStatus.COMPLETED
        assert control.tasks.output(ready["done_task"], requester=parent) == "done"

        notices = control.tasks.drain_notices(parent)
        assert sorted((n.task_id, n.status) for n in notices) == sorted(
            [
                (ready["done_task"], TaskStatus.COMPLETED),
                (ready["running_task"], TaskStatus.INTERRUPTED),
            ]
        )
        interrupted = next(n for n in notices if n.status is TaskStatus.INTERRUPTED)
        assert "was interrupted" in interrupted.summary
        assert "send it a message to continue" in interrupted.summary
        assert control.tasks.drain_notices(parent) == []

        resumed = control.send_message(parent, ready["running_child"], [TextBlock(text="go on")])
        assert resumed.route == "started"
        done = control.tasks.wait(resumed.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED

        assert control.store is not None
        events = control.store.load(ready["running_child"]).events
        ends = [e for e in events if e.kind == EventKind.TURN_END]
        assert [(e.turn, e.data["status"]) for e in ends] == [(1, "interrupted"), (2, "completed")]
        assert ends[0].data["task_id"] == ready["running_task"]
        first_of_turn_2 = next(e for e in events if e.turn == 2)
        assert ends[0].seq < first_of_turn_2.seq  # closed before the next turn began
    finally:
        control.close()


def test_two_runtimes_sweeping_a_lapsed_runtime_settle_each_task_once(
    url: str, children: list[Child]
) -> None:
    # Both sweepers open before the child exists: a runtime sweeps as it opens, and one
    # opened after the stop would settle the Task itself whenever it took longer than the
    # lease's last third to open (under load). Their leases are long enough that their
    # background sweeps never run during the test: the two below are the only ones.
    first = reopen(url, lease_ttl_s=NO_BACKGROUND_SWEEP_S)
    second = reopen(url, lease_ttl_s=NO_BACKGROUND_SWEEP_S)
    try:
        child = Child(url, lease_ttl_s=0.5)
        children.append(child)
        ready = child.ready
        # Stopped, not dead: its pid lives, so only its lapsed lease makes it dead.
        child.proc.send_signal(signal.SIGSTOP)
        assert first.store is not None
        stopped = ready["runtime_id"]

        def lapsed() -> bool:
            assert first.store is not None
            now, suspects = first.store.ledger.suspects()
            return any(r.runtime_id == stopped and is_expired(r, now) for r in suspects)

        eventually(lapsed, "the stopped runtime's lease lapsed")
        barrier = threading.Barrier(2)
        settled: list[int] = []

        def sweep(control: SubagentControl) -> None:
            barrier.wait(WAIT_S)
            settled.append(control._runtime.sweep())  # type: ignore[union-attr]

        threads = [threading.Thread(target=sweep, args=(c,)) for c in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert sum(settled) == 1, settled  # the running Task, by exactly one of them

        events = first.store.load(ready["running_child"]).events
        assert [e.data["status"] for e in events if e.kind == EventKind.TURN_END] == ["interrupted"]
        parent_a = first.agents.register(PARENT)
        parent_b = second.agents.register(PARENT)
        drained = [
            n.task_id
            for n in first.tasks.drain_notices(parent_a) + second.tasks.drain_notices(parent_b)
        ]
        assert sorted(drained) == sorted([ready["running_task"], ready["done_task"]])
    finally:
        first.close()
        second.close()


def test_waiting_on_another_runtimes_task_returns_once_it_settles_there(
    url: str, children: list[Child]
) -> None:
    child = Child(url, lease_ttl_s=30.0)
    children.append(child)
    ready = child.ready
    control = reopen(url, lease_ttl_s=1.0)  # sweeps every third of a second
    try:
        parent = control.agents.register(PARENT)
        running = control.tasks.get(ready["running_task"], requester=parent)
        assert running.status is TaskStatus.RUNNING  # its process lives
        with pytest.raises(SubagentControlError) as raised:
            control.tasks.wait(ready["running_task"], timeout=0.2, requester=parent)
        assert raised.value.code is ErrorCode.TIMEOUT

        waited = in_thread(
            lambda: control.tasks.wait(ready["running_task"], timeout=WAIT_S, requester=parent)
        )
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)
        assert waited.result(timeout=WAIT_S * 2).status is TaskStatus.INTERRUPTED
    finally:
        control.close()
