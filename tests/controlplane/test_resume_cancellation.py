"""SPEC §5 send_message 3: a kill that lands while the resume loads the child wins.

PostgreSQL makes the window observable: an outside transaction locks the store's tables, so
the activation's load waits on the lock (visible in ``pg_locks``) while the test kills it.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from controlplane import AgentHandle, SubagentControl, TaskStatus
from tests.fakes import FakeProvider
from tests.support import MakeControl, eventually, idle_child, in_thread, settle, text

pytestmark = pytest.mark.postgres


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class TableLock:
    """An outside transaction holding every table of the test's schema."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(libpq(url))
        self._watch = psycopg.connect(libpq(url), autocommit=True)

    def take(self) -> None:
        # The transcript's rows, not the headers, Tasks and runtimes: the resume must still
        # record its Task and claim the child (and answer `started`) before its load
        # waits here.
        tables = self._conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename IN ('subagent_events', 'subagent_segments')"
        ).fetchall()
        assert tables, "the store created no tables in the test schema"
        names = ", ".join(name for (name,) in tables)
        self._conn.execute(f"LOCK TABLE {names} IN ACCESS EXCLUSIVE MODE")

    def waiters(self) -> int:
        """Sessions of this database waiting for a lock right now."""
        row = self._watch.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def release(self) -> None:
        self._conn.rollback()

    def close(self) -> None:
        self._conn.close()
        self._watch.close()


@pytest.fixture
def url(pg_url: str) -> str:
    return pg_url


@pytest.fixture
def table_lock(url: str) -> Iterator[TableLock]:
    lock = TableLock(url)
    yield lock
    lock.release()
    lock.close()


def test_a_kill_during_the_load_settles_killed_without_calling_the_provider(
    make_control: MakeControl, provider: FakeProvider, table_lock: TableLock
) -> None:
    control: SubagentControl = make_control()
    parent: AgentHandle = control.agents.register("parent-1")
    child_id = idle_child(control, parent)
    table_lock.take()

    sending = in_thread(lambda: control.send_message(parent, child_id, text("go on")))
    sent = sending.result(5.0)  # `started` comes back at once, before the load
    eventually(lambda: table_lock.waiters() > 0, "the resume's load waits on the table lock")
    control.tasks.kill(sent.task_id, requester=parent)
    table_lock.release()

    snapshot = settle(control, sent.task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    assert provider.resumes == []
