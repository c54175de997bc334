"""SPEC §9 "Outages" and leases across processes: a lease that lapsed while the store was down
is no sign of death, and processes whose wall clocks disagree never take each other's live
children over.

Real runtime processes (``lease_child.py``), each running one live child; every process a
test starts is reaped, pass or fail.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import (
    ErrorCode,
    EventKind,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from persistence import SqlStore, is_expired
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import LockProbe, PostgresServer
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually, raises, text

pytestmark = pytest.mark.slow

reaped = pytest.fixture(reaping, name="reaped")

LEASE_CHILD = Path(__file__).with_name("lease_child.py")
PARENT = "lease-parent"
LEASE_TTL_S = 2.0
SKEW_S = 120.0


class LeaseRuntime(LinesProcess):
    """A ``lease_child.py`` runtime running one live child."""

    def __init__(
        self, url: str, name: str, *, shift_s: float = 0.0, probe: Path | None = None
    ) -> None:
        env = {} if probe is None else {"LEASE_CHILD_PROBE": str(probe)}
        super().__init__(LEASE_CHILD, url, str(LEASE_TTL_S), str(shift_s), name=name, env=env)
        self.runtime_id, self.child_id, self.task_id = self.expect("ready ", WAIT_S).split()

    def steady_s(self) -> float:
        """For how long its renewals have run unbroken."""
        self.say("steady")
        return float(self.expect("steady "))

    def send(self, child_id: str) -> str:
        self.say(f"send {child_id}")
        return self.next_line(WAIT_S)

    def release(self) -> str:
        """End its child's turn; the status its Task settled with."""
        self.say("release")
        return self.expect("settled ", 30.0)


def _steady(runtimes: list[LeaseRuntime], leases: float) -> None:
    """Wait until each runtime has renewed without a break for ``leases`` leases: each
    judges lapsed leases by then, and has swept a few times since."""
    for runtime in runtimes:
        eventually(
            lambda r=runtime: r.steady_s() >= leases * LEASE_TTL_S,  # type: ignore[misc]
            f"{runtime.name} renewing steadily",
            timeout=WAIT_S + leases * LEASE_TTL_S,
        )


def _turn_ends(url: str, child_id: str) -> list[str]:
    store = SqlStore(url, read_only=True)
    try:
        events = store.load(child_id).events
    finally:
        store.close()
    return [str(e.data["status"]) for e in events if e.kind == EventKind.TURN_END]


def _all_completed(url: str, runtimes: list[LeaseRuntime]) -> None:
    """Each live child's Task settles ``completed`` once released: none was swept or
    taken over, and each child has exactly its one turn, closed ``completed``."""
    assert [r.release() for r in runtimes] == ["completed"] * len(runtimes)
    for runtime in runtimes:
        assert _turn_ends(url, runtime.child_id) == ["completed"]


def _all_fenced_by_themselves(url: str, runtimes: list[LeaseRuntime]) -> None:
    """Each live child's Task settled ``interrupted`` by its own runtime's lease watchdog
    (an outage longer than two thirds of the lease fences every runtime: none can tell it
    from a partition, docs/reliability.md, "Partitions"), never swept or taken over by the
    other: its detail says the lease was lost, and each child has exactly its one turn, closed
    ``interrupted``. The runtime answers the same (``release`` waits on its own Task)."""
    assert [r.release() for r in runtimes] == ["interrupted"] * len(runtimes)
    with SqlStore(url, read_only=True) as store:
        for runtime in runtimes:
            task = store.ledger.get(runtime.task_id)
            assert task is not None
            assert task.status is TaskStatus.INTERRUPTED, task
            assert task.outcome is not None
            assert "lease lost" in (task.outcome.detail or ""), task.outcome
            assert runtime.runtime_id in (task.outcome.detail or ""), task.outcome
    for runtime in runtimes:
        assert _turn_ends(url, runtime.child_id) == ["interrupted"]


@contextmanager
def _sqlite_outage(url: str) -> Iterator[None]:
    """The SQLite store refuses every write (an exclusive lock held on the file by another
    connection) while the block runs: each runtime's heartbeat waits, then fails."""
    path = sa.make_url(url).database
    assert path is not None
    conn = sqlite3.connect(path, timeout=WAIT_S, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def test_a_sqlite_outage_longer_than_the_lease_sweeps_no_live_runtime(
    sqlite_url: str, reaped: Reaper
) -> None:
    runtimes = [reaped.add(LeaseRuntime(sqlite_url, name)) for name in ("first", "second")]
    _steady(runtimes, 1.5)  # each would judge the other's lapsed lease now
    with _sqlite_outage(sqlite_url):
        # The fault's length, not a synchronisation: every lease lapses meanwhile.
        threading.Event().wait(3 * LEASE_TTL_S)
    _steady(runtimes, 1.5)  # each has judged the other again since the store came back
    _all_fenced_by_themselves(sqlite_url, runtimes)


@pytest.mark.postgres
def test_a_postgresql_restart_longer_than_the_lease_sweeps_no_live_runtime(
    pg_server: PostgresServer, reaped: Reaper, tmp_path: Path
) -> None:
    url = pg_server.new_database()
    probe = LockProbe(tmp_path / "probe")
    runtimes = [
        reaped.add(LeaseRuntime(url, name, probe=probe.directory)) for name in ("first", "second")
    ]
    first, second = runtimes
    _steady(runtimes, 1.5)  # each would judge the other's lapsed lease now
    pg_server.restart(3 * LEASE_TTL_S)  # every lease lapses meanwhile
    _steady(runtimes, 1.5)  # each has judged the other again since the server came back
    # Each stopped its own child (fenced, not swept), and takes work again: a send from
    # the other resumes that child there, never a second activation at once.
    _all_fenced_by_themselves(url, runtimes)
    assert first.send(second.child_id).startswith("started ")
    assert second.send(first.child_id).startswith("started ")
    assert probe.violations() == []


@pytest.mark.parametrize("shift_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_wall_clocks_apart_by_minutes_take_no_live_child_over(
    sqlite_url: str, reaped: Reaper, shift_s: float
) -> None:
    true = reaped.add(LeaseRuntime(sqlite_url, "true clock"))
    skewed = reaped.add(LeaseRuntime(sqlite_url, f"clock {shift_s:+g} s", shift_s=shift_s))
    runtimes = [true, skewed]
    _steady(runtimes, 2)
    # Each holds its child: a send from the other is refused, never a takeover.
    assert skewed.send(true.child_id) == "refused OWNERSHIP_CONFLICT"
    assert true.send(skewed.child_id) == "refused OWNERSHIP_CONFLICT"
    _all_completed(sqlite_url, runtimes)


def test_a_runtime_just_opened_takes_a_lapsed_lease_for_death_only_after_a_lease(
    sqlite_url: str, reaped: Reaper
) -> None:
    # It cannot know whether the store was out of reach just before it opened: a lease
    # that lapsed then says nothing. A process gone on this host would be dead at once;
    # a stopped one is alive to its pid, so only its lease speaks.
    stopped = reaped.add(LeaseRuntime(sqlite_url, "stopped"))
    stopped.proc.send_signal(signal.SIGSTOP)
    with SqlStore(sqlite_url, read_only=True) as store:

        def lapsed() -> bool:
            now, suspects = store.ledger.suspects()
            return any(r.runtime_id == stopped.runtime_id and is_expired(r, now) for r in suspects)

        eventually(lapsed, "the stopped runtime's lease lapsed", WAIT_S + LEASE_TTL_S)
    control = SubagentControl.open(sqlite_url, lease_ttl_s=LEASE_TTL_S)
    try:
        control.providers.register(FakeProvider())
        parent = control.agents.register(PARENT)
        with raises(ErrorCode.OWNERSHIP_CONFLICT, match="its lease lapsed"):
            control.send_message(parent, stopped.child_id, [TextBlock(text="too soon")])
        sent: list[SendResult] = []

        def taken_over() -> bool:
            try:
                sent.append(control.send_message(parent, stopped.child_id, text("go on")))
            except SubagentControlError as exc:
                if exc.code is not ErrorCode.OWNERSHIP_CONFLICT:
                    raise
                return False
            return True

        eventually(taken_over, "the child taken over", WAIT_S + LEASE_TTL_S)
        assert sent[0].route == "started"
        done = control.tasks.wait(sent[0].task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED
        assert control.tasks.get(stopped.task_id, requester=parent).status is (
            TaskStatus.INTERRUPTED
        )
    finally:
        control.close()
