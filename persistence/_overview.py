"""Reads for a view of the whole store at once (the console): every child's
newest Task, every child's spend, each concurrency key's Tasks, and a change marker.

Each is one statement however many children and Tasks there are, so a page over a
thousand children and ten thousand settled Tasks costs a few reads, not one per row. The
rows are read, never written, here: their writers stay where they are (`TaskLedger`,
`SpendLedger`, `AdmissionQueue`).
The statements are their tables' own (`_children_sql`, `_task_sql`, `_spend_sql`,
`_queue_sql`), built once here where they take no value.

The change marker says whether anything was committed since it was last read, cheaply
enough to be read several times a second by a process that watches the store: SQLite's
``PRAGMA data_version`` on a connection kept for it (it changes when any other connection,
in any process, commits), PostgreSQL's WAL insert position (it moves with every commit
of the server, so another database's writes on a shared server read as a change too:
a watcher then reads once more for nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from controlplane.contract import ChildMeta, TaskSnapshot
from persistence import _task_sql as task_sql
from persistence._children_sql import headers, provider_names
from persistence._codec import construct
from persistence._database import Database
from persistence._queue_sql import unsettled_by_key
from persistence._schema import utc_time
from persistence._scope_spend import ScopeSpend, scope_spend
from persistence._spend_sql import scopes_like
from persistence._task_snapshots import snapshot_of, snapshot_of_columns
from persistence._task_sql import task_table

__all__ = ["ChangeMarker", "KeyedTask", "StoreOverview"]

T = TypeVar("T")
Runner = Callable[[str, Callable[[int], Any]], Any]

_CHILD_SCOPE = "child:"
_BATCH = 5000
"""Task ids per ``IN (…)`` list (a bound on the statement's parameters)."""


@dataclass(frozen=True, slots=True)
class KeyedTask:
    """An unsettled Task under one concurrency key: its admission row's state (``queued``
    or ``admitted``), its place among the key's rows, and the Task's own fields."""

    key: str
    task_id: str
    state: str
    seq: int
    status: str
    label: str
    child_id: str | None


class StoreOverview:
    """The whole-store reads (`SqlStore.overview`); each one short read under the store's
    retry policy."""

    def __init__(self, db: Database, run: Runner) -> None:
        self._db = db
        self._runner = run
        self._columns = list(task_table.columns)
        self._indexed = True
        self._names = provider_names()
        self._named = True
        self._children = headers()
        self._spend = scopes_like(_CHILD_SCOPE)
        self._keyed = unsettled_by_key()

    def children(self) -> list[ChildMeta]:
        """Every child's header, oldest first (`SqlStore.list_children` without the ORM:
        a thousand headers in a few milliseconds)."""

        def op(_attempt: int) -> list[ChildMeta]:
            with self._db.connection(write=False) as conn:
                rows = conn.execute(self._children).all()
            return [
                construct(ChildMeta, {"child_id": child_id, "parent_session": parent,
                                      "depth": depth, "seed_length": seed,
                                      "created_at": utc_time(created), "label": label})
                for child_id, parent, depth, seed, created, label in rows
            ]  # fmt: skip

        return self._run("list children", op)

    def read_older_store(self) -> None:
        """Read a store older than version 11 (opened read-only, so not migrated) as it
        is: its Tasks scanned for each child's newest (`newest_by_index`), and no names
        (`names` is empty)."""
        self._indexed = False
        self._named = False

    def names(self) -> dict[str, tuple[str, str | None]]:
        """Every child's provider and model (its descriptor's ``provider`` and
        ``agent_model``), by child id, from the headers: a child without a descriptor has
        no entry."""
        if not self._named:
            return {}

        def op(_attempt: int) -> dict[str, tuple[str, str | None]]:
            with self._db.connection(write=False) as conn:
                rows = conn.execute(self._names).all()
            return {child_id: (provider, model) for child_id, provider, model in rows}

        return self._run("read the provider of every child", op)

    def newest_by_index(self, indexed: bool) -> None:
        """Whether `latest_tasks` seeks `NEWEST_TASK_INDEX` (the default) or scans every
        Task: the store scans one older than the index, opened read-only and so not
        migrated, where a seek per child would scan per child."""
        self._indexed = indexed

    def latest_tasks(self) -> dict[str, TaskSnapshot]:
        """The newest Task of every child that has one, by child id."""

        def indexed(_attempt: int) -> dict[str, TaskSnapshot]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._db.sql.tasks.newest)
                rows = cursor.fetchall()
            snapshots = (snapshot_of_columns(*row) for row in rows)
            return {s.child_id: s for s in snapshots if s.child_id is not None}

        def scan(_attempt: int) -> dict[str, TaskSnapshot]:
            newest: dict[str, tuple[Any, str]] = {}
            # A raw cursor: the stored times compare as they are (SQLite's fixed-width
            # text, PostgreSQL's timestamps), and 10,000 of them are not converted.
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._db.sql.tasks.task_keys)
                for child_id, created_at, task_id in cursor.fetchall():
                    key = (created_at, task_id)
                    found = newest.get(child_id)
                    if found is None or key > found:
                        newest[child_id] = key
            ids = [task_id for _created, task_id in newest.values()]
            rows: list[Any] = []
            with self._db.connection(write=False) as conn:
                for start in range(0, len(ids), _BATCH):
                    batch = ids[start : start + _BATCH]
                    rows += conn.execute(task_sql.by_ids(self._columns, batch))
            snapshots = (snapshot_of(row) for row in rows)
            return {s.child_id: s for s in snapshots if s.child_id is not None}

        return self._run("read the newest task of each child", indexed if self._indexed else scan)

    def tasks_of(self, child_id: str) -> list[TaskSnapshot]:
        """The Tasks of one child, newest first."""
        query = task_sql.of_child(self._columns, child_id)

        def op(_attempt: int) -> list[TaskSnapshot]:
            with self._db.connection(write=False) as conn:
                return [snapshot_of(row) for row in conn.execute(query)]

        return self._run(f"read the tasks of child {child_id}", op)

    def child_spend(self) -> dict[str, ScopeSpend]:
        """What every child spent with all it started, and its budget, by child id (a child
        that spent nothing and has no budget has no entry)."""

        def op(_attempt: int) -> dict[str, ScopeSpend]:
            with self._db.connection(write=False) as conn:
                rows = conn.execute(self._spend).all()
            spends = (scope_spend(tuple(row)) for row in rows)
            return {s.scope.removeprefix(_CHILD_SCOPE): s for s in spends}

        return self._run("read the spend of every child", op)

    def keyed_tasks(self) -> list[KeyedTask]:
        """Every unsettled Task that entered a concurrency key's queue, key by key, in
        queue order."""

        def op(_attempt: int) -> list[KeyedTask]:
            with self._db.connection(write=False) as conn:
                return [KeyedTask(*row) for row in conn.execute(self._keyed).all()]

        return self._run("read the concurrency queues", op)

    def change_marker(self) -> ChangeMarker:
        """A marker that reads differently once anything was committed since its last read."""
        return ChangeMarker(self._db, self._runner)

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        result: T = self._runner(action, operation)
        return result


class ChangeMarker:
    """Whether the store changed, read cheaply (see the module). Not shared between threads
    at once: one watcher reads it; `close` gives its connection back."""

    def __init__(self, db: Database, run: Runner) -> None:
        self._db = db
        self._runner = run
        self._lock = threading.Lock()
        self._conn: Any = None
        self._sqlite = db.backend.name == "sqlite"

    def read(self) -> tuple[int, ...] | str:
        """The marker now: equal to the previous read when nothing was committed between.

        Raises:
            SubagentControlError: ``STORE_UNAVAILABLE`` when the database cannot be read.
        """
        return self._run("read the store's change marker", self._read)

    def close(self) -> None:
        """Give back the connection the marker keeps."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _read(self, attempt: int) -> tuple[int, ...] | str:
        with self._lock:
            if attempt > 1 and self._conn is not None:  # a failed read: a fresh connection
                self._conn.invalidate()
                self._conn = None
            if self._conn is None:
                self._conn = self._db.engine.raw_connection()
            cursor = self._conn.cursor()
            try:
                if self._sqlite:
                    # data_version moves with other connections' commits, total_changes
                    # with this one's (an in-memory store has only one).
                    cursor.execute("SELECT total_changes()")
                    (own,) = cursor.fetchone()
                    cursor.execute("PRAGMA data_version")
                    (others,) = cursor.fetchone()
                    return (int(others), int(own))
                cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
                (lsn,) = cursor.fetchone()
                self._conn.rollback()  # no transaction left open between reads
                return str(lsn)
            finally:
                cursor.close()

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        result: T = self._runner(action, operation)
        return result
