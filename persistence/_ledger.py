"""Tasks and the runtimes that run them, kept in the store (SPEC §9).

A Task row is written when the Task is admitted and updated once when it settles; a
runtime row is renewed by its heartbeat. Nothing here is on the steer path. The Task's
settlement that ends a published turn is written by `SqlStore.append` in the turn's own
transaction (`settle_sql`), so the transcript and the Task never disagree.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, Row, delete, event, func, insert, select, text, update
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.pool import PoolProxiedConnection

from controlplane.contract import (
    ErrorCode,
    RuntimeInfo,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from persistence._database import Database
from persistence._schema import (
    CHILDREN,
    NOTICE_PENDING,
    RUNNING_TASK,
    TASKS,
    ChildRow,
    RuntimeRow,
    TaskRow,
    sqlite_time,
    utc_time,
)

__all__ = [
    "Fence",
    "Settlement",
    "TaskLedger",
    "TaskStatements",
    "admit_params",
    "is_expired",
    "release_sql",
    "settle_params",
    "settle_sql",
    "snapshot_of",
]

T = TypeVar("T")
Runner = Callable[[str, Callable[[int], Any]], Any]

Settlement = tuple[str, TaskOutcome, datetime]
"""A Task's settlement to write: its id, its outcome, when it settled."""

Fence = tuple[str, int]
"""A writer's claim on a child: its runtime id and the fencing number it claimed under."""

_RUNNING = TaskStatus.RUNNING.value
# The partial indexes' own predicates, as literals: a bound parameter would hide from the
# planner that a query only wants the rows the index holds.
_IS_RUNNING = text(RUNNING_TASK)
_HAS_NOTICE = text(NOTICE_PENDING)


def settle_sql(p: str) -> str:
    """The Task settlement as one raw statement with placeholder ``p``: it changes a
    running Task only, so a settlement is written once whoever tries it."""
    return (
        f"UPDATE {TASKS} SET status = {p}, output = {p}, detail = {p}, code = {p}, "
        f"settled_at = {p}, notice_pending = {p} WHERE task_id = {p} AND status = {p}"
    )


def release_sql(p: str) -> str:
    """Release a child's claim taken under a fencing number (takes child id, number)."""
    return (
        f"UPDATE {CHILDREN} SET claim_runtime = NULL, claim_task = NULL "
        f"WHERE child_id = {p} AND fence = {p}"
    )


_TASK_COLUMNS = (
    "task_id, label, owner_session, child_id, runtime_id, status, output, detail, code, "
    "created_at, settled_at"
)
"""What a Task's snapshot is built from, in `_snapshot`'s order (``kind`` is always
``subagent``)."""


@dataclass(frozen=True, slots=True)
class TaskStatements:
    """The Task rows' hand-written SQL, with the driver's placeholder."""

    admit: str
    task: str
    """One Task's `_TASK_COLUMNS`, by id."""

    @classmethod
    def build(cls, p: str) -> TaskStatements:
        """The statements with placeholder ``p``."""
        return cls(
            admit=(
                f"INSERT INTO {TASKS} (task_id, kind, label, owner_session, child_id, "
                f"runtime_id, status, created_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
            ),
            task=f"SELECT {_TASK_COLUMNS} FROM {TASKS} WHERE task_id = {p}",
        )


def admit_params(task: TaskSnapshot, stamp: Any) -> tuple[Any, ...]:
    """The parameters of `TaskStatements.admit` (``stamp``: ``created_at`` for the driver)."""
    return (task.id, task.kind, task.label, task.owner_session, task.child_id,
            task.runtime_id or "", _RUNNING, stamp)  # fmt: skip


def settle_params(settlement: Settlement, stamp: object) -> tuple[Any, ...]:
    """The parameters of `settle_sql` (``stamp`` is ``settled_at`` as the driver takes it)."""
    task_id, outcome, _when = settlement
    code = outcome.code.value if outcome.code is not None else None
    return (outcome.status.value, outcome.output, outcome.detail, code, stamp, True, task_id,
            _RUNNING)  # fmt: skip


class TaskLedger:
    """The store's Task and runtime rows. Every operation is one short transaction, run
    under the store's retry policy (``run``)."""

    def __init__(self, db: Database, run: Runner) -> None:
        self._db = db
        self._runner = run
        self._sql = TaskStatements.build(db.sql.placeholder)
        self._postgres = db.backend.name == "postgresql"
        self._reader = _PointReader(db)

    # -- runtimes --------------------------------------------------------------------

    def register_runtime(
        self, runtime_id: str, *, host: str, pid: int, boot_id: str | None, lease_ttl_s: float
    ) -> RuntimeInfo:
        """Record a new runtime, its heartbeat fresh."""

        def op(_attempt: int) -> RuntimeInfo:
            with self._db.connection(write=True) as conn:
                now = self._now(conn)
                info = RuntimeInfo(
                    runtime_id=runtime_id,
                    host=host,
                    pid=pid,
                    boot_id=boot_id,
                    started_at=now,
                    heartbeat_at=now,
                    lease_ttl_s=lease_ttl_s,
                )
                known = select(RuntimeRow.runtime_id).where(RuntimeRow.runtime_id == runtime_id)
                if conn.execute(known).first() is None:  # a retry may find it written
                    row = info.model_dump(exclude={"closed_at", "running_tasks"})
                    conn.execute(insert(RuntimeRow).values(row))
            return info

        return self._run(f"register runtime {runtime_id}", op)

    def heartbeat(self, runtime_id: str) -> bool:
        """Renew a runtime's heartbeat; False if it is closed (or unknown)."""

        def op(_attempt: int) -> bool:
            with self._db.connection(write=True) as conn:
                result = conn.execute(
                    update(RuntimeRow)
                    .where(RuntimeRow.runtime_id == runtime_id, RuntimeRow.closed_at.is_(None))
                    .values(heartbeat_at=self._now(conn))
                )
                return bool(result.rowcount)

        return self._run(f"renew runtime {runtime_id}", op)

    def close_runtime(self, runtime_id: str) -> None:
        """Mark a runtime closed: from now on it is dead to every other runtime."""

        def op(_attempt: int) -> None:
            with self._db.connection(write=True) as conn:
                conn.execute(
                    update(RuntimeRow)
                    .where(RuntimeRow.runtime_id == runtime_id, RuntimeRow.closed_at.is_(None))
                    .values(closed_at=self._now(conn))
                )

        self._run(f"close runtime {runtime_id}", op)

    def runtimes(self) -> list[RuntimeInfo]:
        """Every runtime the store knows, oldest first, with its count of running Tasks."""
        running = (
            select(TaskRow.runtime_id, func.count().label("n"))
            .where(_IS_RUNNING)
            .group_by(TaskRow.runtime_id)
            .subquery()
        )
        query = (
            select(*RuntimeRow.__table__.c, func.coalesce(running.c.n, 0).label("running"))
            .outerjoin(running, running.c.runtime_id == RuntimeRow.runtime_id)
            .order_by(RuntimeRow.started_at, RuntimeRow.runtime_id)
        )

        def op(_attempt: int) -> list[RuntimeInfo]:
            with self._db.connection(write=False) as conn:
                return [_runtime(row, int(row.running)) for row in conn.execute(query)]

        return self._run("list runtimes", op)

    def runtime(self, runtime_id: str) -> RuntimeInfo | None:
        """One runtime by id, with its count of running Tasks; None if the store has no
        such runtime (a kill of a Task held elsewhere reads the one it needs)."""
        running = (
            select(func.count())
            .select_from(TaskRow)
            .where(_IS_RUNNING, TaskRow.runtime_id == runtime_id)
            .scalar_subquery()
        )
        query = select(*RuntimeRow.__table__.c, running.label("running")).where(
            RuntimeRow.runtime_id == runtime_id
        )

        def op(_attempt: int) -> RuntimeInfo | None:
            with self._db.connection(write=False) as conn:
                row = conn.execute(query).first()
            return None if row is None else _runtime(row, int(row.running))

        return self._run(f"read runtime {runtime_id}", op)

    def claims(self) -> dict[str, list[tuple[str, str | None, int]]]:
        """Which runtime holds which child: runtime id → ``(child id, Task id, fencing
        number)`` for every claimed child."""
        query = (
            select(ChildRow.claim_runtime, ChildRow.child_id, ChildRow.claim_task, ChildRow.fence)
            .where(ChildRow.claim_runtime.is_not(None))
            .order_by(ChildRow.claim_runtime, ChildRow.child_id)
        )

        def op(_attempt: int) -> dict[str, list[tuple[str, str | None, int]]]:
            held: dict[str, list[tuple[str, str | None, int]]] = {}
            with self._db.connection(write=False) as conn:
                for runtime_id, child_id, task_id, fence in conn.execute(query):
                    held.setdefault(str(runtime_id), []).append((child_id, task_id, int(fence)))
            return held

        return self._run("list claims", op)

    def suspects(self) -> tuple[datetime, list[RuntimeInfo]]:
        """The database's clock now, and every runtime that still has a running Task and
        is closed or has a heartbeat older than its lease: dead to everyone. (A runtime
        whose process is gone is recognised by the caller, which knows its own host.)"""
        query = select(RuntimeRow).where(
            RuntimeRow.runtime_id.in_(select(TaskRow.runtime_id).where(_IS_RUNNING).distinct())
        )

        def op(_attempt: int) -> tuple[datetime, list[RuntimeInfo]]:
            with self._db.connection(write=False) as conn:
                now = self._now(conn)
                return now, [_runtime(row, 0) for row in conn.execute(query)]

        return self._run("find dead runtimes", op)

    # -- tasks -----------------------------------------------------------------------

    def admit(self, task: TaskSnapshot) -> None:
        """Write a Task that has just been admitted (running). On a start's path: one
        hand-written statement on a cursor, not the ORM (8x the cost, measured)."""
        params = admit_params(task, self._stamp(task.created_at))

        def op(attempt: int) -> None:
            with self._db.cursor(write=True) as cursor:
                if attempt > 1:
                    cursor.execute(self._sql.task, (task.id,))
                    if cursor.fetchone() is not None:
                        return  # our earlier attempt committed, its acknowledgement was lost
                cursor.execute(self._sql.admit, params)

        self._run(f"record task {task.id}", op)

    def settle(self, settlement: Settlement) -> bool:
        """Write a Task's settlement; False if it was no longer running (settled before)."""
        task_id, outcome, when = settlement

        def op(_attempt: int) -> bool:
            with self._db.connection(write=True) as conn:
                result = conn.execute(
                    update(TaskRow)
                    .where(TaskRow.task_id == task_id, TaskRow.status == _RUNNING)
                    .values(_settled_values(outcome, when))
                )
                # A Task that settles before its turn was published holds its child's
                # claim (a resume's): it goes with the Task.
                child = select(TaskRow.child_id).where(TaskRow.task_id == task_id)
                conn.execute(
                    update(ChildRow)
                    .where(
                        ChildRow.child_id == child.scalar_subquery(),
                        ChildRow.claim_task == task_id,
                    )
                    .values(claim_runtime=None, claim_task=None)
                )
                return bool(result.rowcount)

        return self._run(f"settle task {task_id}", op)

    def forget(self, task_id: str) -> None:
        """Delete a Task that was admitted but never started (its caller was told so)."""

        def op(_attempt: int) -> None:
            with self._db.connection(write=True) as conn:
                conn.execute(delete(TaskRow).where(TaskRow.task_id == task_id))

        self._run(f"forget task {task_id}", op)

    def get(self, task_id: str) -> TaskSnapshot | None:
        """One Task, or None: one statement on a cursor (a Task read from another runtime
        or from before a restart costs about what the raw select does)."""

        def op(_attempt: int) -> TaskSnapshot | None:
            row = self._reader.one(self._sql.task, (task_id,))
            return None if row is None else _snapshot(*row)

        return self._run(f"read task {task_id}", op)

    def owned_by(self, owner_session: str) -> list[TaskSnapshot]:
        """The owner's Tasks, oldest first."""
        query = (
            select(TaskRow)
            .where(TaskRow.owner_session == owner_session)
            .order_by(TaskRow.created_at, TaskRow.task_id)
        )
        return self._run("list tasks", lambda _attempt: self._select(query))

    def recent(
        self, owner_session: str | None = None, *, limit: int | None = None
    ) -> list[TaskSnapshot]:
        """Every Task (of ``owner_session`` when given), newest first, at most ``limit``."""
        query = select(TaskRow).order_by(TaskRow.created_at.desc(), TaskRow.task_id.desc())
        if owner_session is not None:
            query = query.where(TaskRow.owner_session == owner_session)
        if limit is not None:
            query = query.limit(limit)
        return self._run("list tasks", lambda _attempt: self._select(query))

    def running(self, runtime_ids: Sequence[str]) -> list[TaskSnapshot]:
        """The running Tasks of these runtimes, oldest first."""
        query = (
            select(TaskRow)
            .where(_IS_RUNNING, TaskRow.runtime_id.in_(list(runtime_ids)))
            .order_by(TaskRow.created_at)
        )
        return self._run("list running tasks", lambda _attempt: self._select(query))

    def drain(self, owner_session: str) -> list[TaskSnapshot]:
        """Take the owner's pending completion notices: each settled Task once, across
        every runtime (one UPDATE … RETURNING, so two drains never take the same row)."""
        statement = (
            update(TaskRow)
            .where(TaskRow.owner_session == owner_session, _HAS_NOTICE)
            .values(notice_pending=None)
            .returning(*TaskRow.__table__.columns)
        )

        def op(_attempt: int) -> list[TaskSnapshot]:
            with self._db.connection(write=True) as conn:
                rows = conn.execute(statement).all()
            return sorted(
                (snapshot_of(row) for row in rows),
                key=lambda t: (t.settled_at or t.created_at, t.id),
            )

        return self._run("drain notices", op)

    def latest_by_child(self, owner_session: str) -> dict[str, TaskSnapshot]:
        """The newest Task of each of the owner's children."""
        return {task.child_id: task for task in self.owned_by(owner_session) if task.child_id}

    # -- plumbing --------------------------------------------------------------------

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        result: T = self._runner(action, operation)
        return result

    def _select(self, query: Any) -> list[TaskSnapshot]:
        with self._db.connection(write=False) as conn:
            return [snapshot_of(row) for row in conn.execute(query)]

    def _stamp(self, when: datetime) -> object:
        return sqlite_time(when) if self._db.backend.text_times else when

    def _now(self, conn: Any) -> datetime:
        """The database's clock on PostgreSQL (hosts' clocks may drift apart; the shared
        server's is one for all); this host's on SQLite, which only one host shares."""
        if self._postgres:
            return utc_time(conn.execute(select(func.now())).scalar_one())
        return utcnow()


class _PointReader:
    """One connection kept out of the pool for the Tasks' point reads, and its cursor.

    A pooled read pays a checkout and a reset on return, together about as much as the
    primary-key select itself (measured). Reads need no transaction (the driver runs in
    autocommit on both backends), and each read fetches its statement to the end, which
    ends the statement's read snapshot with it: the next read, from any thread, sees
    every commit made before it began (SQLite's WAL readers do not block the writer). The
    driver keeps the statement prepared between reads (sqlite3's statement cache;
    psycopg prepares a statement run often on the server).

    One thread at a time reads here; another one meanwhile takes a pooled connection
    rather than wait, as does a forked process (the connection is its parent's) and an
    in-memory database (one connection, which only the store's lock may use). A failed
    read drops the connection (the retry policy's next attempt opens a new one); the
    store's close disposes of its engine, and the connection goes with it.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._conn: PoolProxiedConnection | None = None
        self._cursor: DBAPICursor | None = None
        self._open = not db.backend.single_connection
        self._inherited = False
        if self._open:
            event.listen(db.engine, "engine_disposed", self._close)
            _READERS.add(self)

    def one(self, statement: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The row of a select that finds at most one, or None."""
        if not (self._open and self._lock.acquire(blocking=False)):
            with self._db.cursor(write=False) as cursor:
                cursor.execute(statement, params)
                rows = cursor.fetchall()
            return rows[0] if rows else None
        try:
            kept = self._cursor
            if kept is None:
                self._conn = self._db.engine.raw_connection()
                kept = self._cursor = self._conn.cursor()
            kept.execute(statement, params)
            rows = kept.fetchall()  # to the end: the statement holds no snapshot after
            return rows[0] if rows else None
        except BaseException:
            # Whatever failed (the database, the connection, an interrupt mid-read), the
            # next read starts on a new connection: this one may be unsound.
            self._drop()
            raise
        finally:
            self._lock.release()

    def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            conn.invalidate()

    def _forked(self) -> None:
        """In a forked child: the connection is the parent's, never to be used or closed
        here (nor the lock, which a thread of the parent may have held)."""
        self._lock = threading.Lock()
        self._open = False
        self._inherited = True

    def _close(self, _engine: Engine) -> None:
        with self._lock:
            self._open = False
            if self._inherited:
                return
            conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            conn.detach()  # closed for good, not handed back to the pool just disposed of
            conn.close()


_READERS: weakref.WeakSet[_PointReader] = weakref.WeakSet()


def _after_fork() -> None:
    for reader in list(_READERS):
        reader._forked()


os.register_at_fork(after_in_child=_after_fork)


def _settled_values(outcome: TaskOutcome, when: datetime) -> dict[str, Any]:
    return {
        "status": outcome.status.value,
        "output": outcome.output,
        "detail": outcome.detail,
        "code": outcome.code.value if outcome.code is not None else None,
        "settled_at": when,
        "notice_pending": True,
    }


def snapshot_of(row: Row[Any]) -> TaskSnapshot:
    """A Task row, read by name, as the frozen snapshot callers see."""
    return _snapshot(
        row.task_id, row.label, row.owner_session, row.child_id, row.runtime_id, row.status,
        row.output, row.detail, row.code, row.created_at, row.settled_at,
    )  # fmt: skip


def _snapshot(
    task_id: str,
    label: str,
    owner_session: str,
    child_id: str | None,
    runtime_id: str,
    status_value: str,
    output: str | None,
    detail: str | None,
    code: str | None,
    created_at: object,
    settled_at: object,
) -> TaskSnapshot:
    """A Task's `_TASK_COLUMNS` as its frozen snapshot, built without validation: every
    value comes from a row this store wrote from a validated snapshot (`_constructed`)."""
    status = _STATUSES[status_value]
    outcome = None
    if status is not TaskStatus.RUNNING:
        outcome = _constructed(
            TaskOutcome,
            {
                "status": status,
                "output": output,
                "detail": detail,
                "code": _CODES[code] if code else None,
            },
            _OUTCOME_SET,
        )
    settled = None if settled_at is None else utc_time(settled_at)
    return _constructed(
        TaskSnapshot,
        {
            "id": task_id,
            "kind": _KIND,
            "label": label,
            "owner_session": owner_session,
            "status": status,
            "outcome": outcome,
            "child_id": child_id,
            "runtime_id": runtime_id or None,
            "created_at": utc_time(created_at),
            "settled_at": settled,
            "ended_at": settled,
        },
        _SNAPSHOT_SET,
    )


M = TypeVar("M", TaskSnapshot, TaskOutcome)

_STATUSES = {status.value: status for status in TaskStatus}
_CODES = {code.value: code for code in ErrorCode}
_KIND = TaskSnapshot.model_fields["kind"].default
_OUTCOME_SET = frozenset(TaskOutcome.model_fields)
_SNAPSHOT_SET = frozenset(TaskSnapshot.model_fields) - {"kind"}
_new = object.__new__
_set = object.__setattr__


def _constructed(cls: type[M], values: dict[str, Any], fields_set: frozenset[str]) -> M:
    """What ``cls.model_construct(**values)`` returns, ``values`` holding every field in
    declaration order (``fields_set``: those not left at their default).

    ``model_construct`` walks every field in Python and cost more than validating does
    (pydantic 2.14: ~18 µs for a settled Task against ~8 µs validated, more than the
    primary-key select); this sets the four slots it sets, and nothing else. Valid for
    frozen models without private attributes or extras, as both here are; a test checks
    the result against validation for every status, so a pydantic that changes its
    slots fails there, not in a caller.
    """
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(fields_set))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def _runtime(row: Any, running: int) -> RuntimeInfo:
    closed = row.closed_at
    return RuntimeInfo(
        runtime_id=row.runtime_id,
        host=row.host,
        pid=row.pid,
        boot_id=row.boot_id,
        started_at=utc_time(row.started_at),
        heartbeat_at=utc_time(row.heartbeat_at),
        lease_ttl_s=row.lease_ttl_s,
        closed_at=None if closed is None else utc_time(closed),
        running_tasks=running,
    )


def is_expired(runtime: RuntimeInfo, now: datetime) -> bool:
    """Whether a runtime is dead to everyone: closed, or its lease lapsed."""
    if runtime.closed_at is not None:
        return True
    return runtime.heartbeat_at + timedelta(seconds=runtime.lease_ttl_s) < now
