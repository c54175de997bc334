"""The SQLite writer connection a store keeps between appends survives a failed commit:
the store rolls it back and replaces it, so one failure (a full disk, an I/O error) does
not fail every later write."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from controlplane import ErrorCode, SubagentControlError
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import message, new_child


class FailingCommit:
    """Makes the next ``COMMIT`` on any of a store's connections fail, as a full disk
    would: SQLite's own error, raised by the real ``COMMIT``, whose transaction SQLite
    then leaves open (an interrupted COMMIT does that, as a deferred constraint does).

    Installed on each connection the store's pool hands out: a trace callback sees the
    ``COMMIT`` statement start, and a progress handler then interrupts it.
    """

    def __init__(self, statement: str = "COMMIT") -> None:
        self._statement = statement  # the start of the statement to fail
        self._armed = False
        self._interrupt_next = False
        self.failed = 0

    def arm(self) -> None:
        self._armed = True

    def install(
        self, dbapi_connection: Any, _record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
    ) -> None:
        assert isinstance(dbapi_connection, sqlite3.Connection)
        dbapi_connection.set_trace_callback(self._traced)
        dbapi_connection.set_progress_handler(self._progress, 1)

    def _traced(self, statement: str) -> None:
        if self._armed and statement.startswith(self._statement):
            self._armed, self._interrupt_next = False, True

    def _progress(self) -> int:
        if self._interrupt_next:
            self._interrupt_next = False
            self.failed += 1
            return 1  # non-zero: SQLite abandons the statement with SQLITE_INTERRUPT
        return 0


@pytest.mark.parametrize("retry", [RetryPolicy.immediate(), RetryPolicy.immediate(max_attempts=1)])
def test_after_a_failed_commit_the_next_append_succeeds_and_only_successful_ones_are_stored(
    sqlite_url: str, retry: RetryPolicy
) -> None:
    with SqlStore(sqlite_url, retry=retry) as store:
        meta = new_child(store)
        failing = FailingCommit()
        event.listen(store._db.engine, "checkout", failing.install)
        first = store.append(meta.child_id, [message(1)])  # the writer is now kept

        failing.arm()
        with pytest.raises(SubagentControlError) as raised:
            store.append(meta.child_id, [message(2), message(3)])
        assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
        assert failing.failed == 1

        later = store.append(meta.child_id, [message(4)])
        again = store.append(meta.child_id, [message(5)])

        assert [e.seq for e in [*first, *later, *again]] == [1, 2, 3]
        stored = store.load(meta.child_id).events
        assert stored == [*first, *later, *again]
        assert [e.data["n"] for e in stored] == [1, 4, 5]


@pytest.mark.parametrize(
    ("statement", "events"),
    [
        ("COMMIT", 2),  # a batch: BEGIN IMMEDIATE … COMMIT
        ("INSERT INTO subagent_events", 1),  # one event: one statement that commits itself
    ],
)
def test_a_failed_commit_leaves_nothing_open_for_the_next_writer(
    sqlite_url: str, statement: str, events: int
) -> None:
    # Another connection can take the write lock at once: the failed transaction, and the
    # lock it held, were given up rather than kept on the store's writer.
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate(max_attempts=1)) as store:
        meta = new_child(store)
        failing = FailingCommit(statement)
        event.listen(store._db.engine, "checkout", failing.install)
        store.append(meta.child_id, [message(1)])
        failing.arm()
        with pytest.raises(SubagentControlError):
            store.append(meta.child_id, [message(n) for n in range(2, 2 + events)])
        assert failing.failed == 1

        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        finally:
            other.close()
