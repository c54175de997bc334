"""SPEC §9 "Lease safety", in one process: a runtime whose store stops answering fences
itself before its lease can lapse in anyone else's eyes.

The store is a real SQLite file that another connection write-locks (``BEGIN EXCLUSIVE``)
with a busy timeout far longer than the lease: the runtime's heartbeat then waits inside a
store call for the whole test, as it would on a silent network. Nothing about the store is
faked; the watchdog must act without it.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import CancelSignal
from controlplane.models import (
    ModelReply,
    ModelRequest,
    ToolCall,
)
from persistence import SqlStore
from persistence._schema import RUNTIMES
from tests.support import WAIT_S, eventually, raises, wait_published

LEASE_S = 1.5


class CallLog:
    """Every model and tool call of the child, on the monotonic clock, and the moment
    each model call saw its cancellation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, float]] = []
        self.cancelled_at: float | None = None
        self.blocking = threading.Event()

    def record(self, what: str, signal: CancelSignal) -> bool:
        """Log a call about to act; False (and nothing logged) if it was cancelled first."""
        with self._lock:
            now = time.monotonic()  # read before the check: a logged call began before it
            if signal.aborted:
                return False
            self.calls.append((what, now))
            return True


class BusyModel:
    """A live agent's model: a tool call, then a long generation that only a cancel ends,
    then (in a later turn) a plain answer."""

    def __init__(self, log: CallLog) -> None:
        self._log = log
        self._n = 0

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        if not self._log.record("model", signal):
            raise_cancelled(signal)
        self._n += 1
        if self._n == 1:
            return ModelReply(tool_calls=[ToolCall(id="c1", name="probe", arguments="{}")])
        if self._n == 2:
            self._log.blocking.set()
            signal.wait(60)
            self._log.cancelled_at = time.monotonic()
            raise_cancelled(signal)
        return ModelReply(text="done")


def raise_cancelled(signal: CancelSignal) -> None:
    raise SubagentControlError(ErrorCode.CANCELLED, f"cancelled: {signal.reason}")


@pytest.fixture
def db(tmp_path: object) -> str:
    return f"{tmp_path}/lease.db"


@pytest.fixture
def calls() -> CallLog:
    return CallLog()


@pytest.fixture
def control(db: str, calls: CallLog) -> Iterator[SubagentControl]:
    # A busy timeout far past the lease: a locked store makes a store call wait, not fail.
    store = SqlStore(f"sqlite:///{db}", lock_timeout_s=60.0)
    tool = ChildTool(
        "probe",
        "Touch the world.",
        {"type": "object"},
        lambda _args, signal: "ok" if calls.record("tool", signal) else "cancelled",
    )
    control = SubagentControl(store, lease_ttl_s=LEASE_S, close_timeout_s=5.0)
    control.providers.register(InProcessProvider(BusyModel(calls), tools=[tool]))
    yield control
    control.close()
    store.close()


def test_a_runtime_whose_store_hangs_stops_its_activations_before_its_lease_can_lapse(
    control: SubagentControl, db: str, calls: CallLog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.runtime.lease._own_lease")
    parent = control.agents.register("parent")
    start = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="busy", parent=parent, prompt=[TextBlock(text="go")]
        )
    )
    assert calls.blocking.wait(WAIT_S), "the child never reached its long model call"
    # Published: the activation thread is out of the store (an activation stuck in a store
    # call stops acting all the same, but answers only once that call gives up).
    wait_published(control, start.child_id)

    locker = sqlite3.connect(db, isolation_level=None, timeout=WAIT_S)
    locker.execute("BEGIN EXCLUSIVE")  # every write of the runtime now waits
    locked_at = time.monotonic()  # every renewal sent from now on hangs
    try:
        # The runtime's own answer, while its store still hangs.
        snap = control.tasks.wait(start.task_id, timeout=LEASE_S * 2, requester=parent)
        answered_at = time.monotonic()
        assert snap.status is TaskStatus.INTERRUPTED
        assert snap.outcome is not None
        assert snap.outcome.detail is not None
        assert "interrupted" in snap.outcome.detail
        assert "lease lost" in snap.outcome.detail

        # Fenced before the lease could lapse: the watchdog fired at most two thirds of
        # the lease after the last renewal that succeeded was sent.
        (fired,) = [r for r in caplog.records if r.name == "controlplane.runtime.lease._own_lease"]
        sent = re.search(r"was sent at ([0-9.]+) on the monotonic clock", fired.getMessage())
        assert sent is not None, fired.getMessage()
        last_renewal_sent = float(sent.group(1))
        assert last_renewal_sent < locked_at
        assert calls.cancelled_at is not None
        assert calls.cancelled_at < last_renewal_sent + LEASE_S
        # The runtime's own answer came before the lease could lapse for anyone (not after
        # the store call the heartbeat is stuck in, which waits out a 60 s busy timeout).
        assert answered_at < last_renewal_sent + LEASE_S, "the local answer waited"
        # Nothing acted after the fence.
        assert all(at <= calls.cancelled_at for _what, at in calls.calls), calls.calls
        assert [what for what, _at in calls.calls] == ["model", "tool", "model"]
        # No new work while it cannot renew.
        with raises(ErrorCode.STORE_UNAVAILABLE, match="lease lost"):
            control.send_message(parent, start.child_id, [TextBlock(text="again")])
    finally:
        locker.execute("ROLLBACK")
        locker.close()

    # The store comes back: the runtime writes the Task's settlement and closes the turn.
    store = control.store
    assert store is not None

    def stored() -> bool:
        task = store.ledger.get(start.task_id)
        return task is not None and task.status is TaskStatus.INTERRUPTED

    eventually(stored, "the store settled the fenced Task", timeout=LEASE_S * 4)
    stored_task = store.ledger.get(start.task_id)
    assert stored_task is not None
    assert stored_task.outcome is not None
    assert "lease lost" in (stored_task.outcome.detail or "")
    last = store.load(start.child_id).events[-1]
    assert last.kind == EventKind.TURN_END
    assert last.data == {"task_id": start.task_id, "status": "interrupted"}

    # ... renews, and takes new work again: the next send re-claims the child.
    def resumed() -> bool:
        try:
            res = control.send_message(parent, start.child_id, [TextBlock(text="again")])
        except SubagentControlError as exc:  # refused until the runtime readmits
            if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                raise
            return False
        assert res.route == "started"
        done = control.tasks.wait(res.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        return True

    eventually(resumed, "a send after the outage resumed the child", timeout=LEASE_S * 4)


def test_a_runtime_whose_row_was_expired_while_it_was_cut_off_registers_again_and_takes_work(
    control: SubagentControl, db: str
) -> None:
    # What a runtime cut off for long finds when the store answers again: the others
    # settled its Tasks and expired its row. It must not act on a lease it no longer has,
    # nor refuse work for ever: it writes its row again, and once renewed takes work.
    control.providers.register(InProcessProvider(ScriptedModel(["ok"]), name="plain"))
    parent = control.agents.register("parent")
    start = control.start_continuable(
        ContinuableStartSpec(
            provider="plain", label="idle", parent=parent, prompt=[TextBlock(text="go")]
        )
    )
    assert control.tasks.wait(start.task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )
    store = control.store
    assert store is not None
    with sqlite3.connect(db, isolation_level=None, timeout=WAIT_S) as raw:
        raw.execute(f"DELETE FROM {RUNTIMES} WHERE runtime_id = ?", (control.runtime_id,))

    def registered() -> bool:
        row = store.ledger.runtime(control.runtime_id)
        return row is not None and row.closed_at is None

    eventually(registered, "the runtime wrote its row again", timeout=LEASE_S * 4)

    def resumed() -> bool:
        try:
            res = control.send_message(parent, start.child_id, [TextBlock(text="again")])
        except SubagentControlError as exc:  # refused until a renewal re-arms the lease
            if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                raise
            return False
        done = control.tasks.wait(res.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        return True

    eventually(resumed, "a send resumed the child", timeout=LEASE_S * 4)


REARM_LEASE_S = 60.0
"""Renewals every 3 s, the heartbeat's flush every 20 s: a settlement written at the
renewal that re-arms the lease is told apart from one written at the next flush."""


def test_a_renewal_that_rearms_a_fenced_runtime_settles_its_tasks_and_readmits_at_once(
    db: str, calls: CallLog
) -> None:
    # A fenced runtime keeps its fenced children's claims and refuses new Tasks until it
    # has written their settlements; it wrote them at its heartbeat's next flush, up to a
    # third of the lease after the renewal that re-armed it (the kernel-fault stress saw
    # children of a runtime fenced by a 2 s drop reached only 5.6-6.9 s after the heal).
    store = SqlStore(f"sqlite:///{db}")
    control = SubagentControl(store, lease_ttl_s=REARM_LEASE_S, close_timeout_s=5.0)
    try:
        control.providers.register(InProcessProvider(BusyModel(calls)))
        parent = control.agents.register("parent")
        start = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="busy", parent=parent, prompt=[TextBlock(text="go")]
            )
        )
        assert calls.blocking.wait(WAIT_S), "the child never reached its long model call"
        wait_published(control, start.child_id)
        heartbeat = control._heartbeat
        assert heartbeat is not None
        heartbeat.lease.lose("told so by the test")  # fences at once
        snap = control.tasks.wait(start.task_id, timeout=WAIT_S, requester=parent)
        assert snap.status is TaskStatus.INTERRUPTED

        def stored() -> bool:
            task = store.ledger.get(start.task_id)
            return task is not None and task.status is TaskStatus.INTERRUPTED

        # The next renewal goes out within a twentieth of the lease (3 s) and re-arms it.
        eventually(stored, "the fenced Task's settlement was written", timeout=8.0)
        res = control.send_message(parent, start.child_id, [TextBlock(text="again")])
        assert res.route == "started"  # readmitted: new work is taken again
    finally:
        control.close()
        store.close()
