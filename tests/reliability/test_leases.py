"""SPEC §9 "Outages" and leases across processes: a lease that lapsed while the store was down
is no sign of death, and processes whose wall clocks disagree never take each other's live
children over.

Real runtime processes (``lease_child.py``), each running one live child; every process a
test starts is reaped, pass or fail.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import EventKind
from persistence import SqlStore
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually

pytestmark = pytest.mark.slow

reaped = pytest.fixture(reaping, name="reaped")

LEASE_CHILD = Path(__file__).with_name("lease_child.py")
LEASE_TTL_S = 2.0


class LeaseRuntime(LinesProcess):
    """A ``lease_child.py`` runtime running one live child."""

    def __init__(self, url: str, name: str, *, shift_s: float = 0.0) -> None:
        super().__init__(LEASE_CHILD, url, str(LEASE_TTL_S), str(shift_s), name=name)
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
    _all_completed(sqlite_url, runtimes)
