"""Tasks and the runtimes that run them, kept in the store.

A Task row is written when the Task is admitted and updated once when it settles; a
runtime row is renewed by its heartbeat. Nothing here is on the steer path. The Task's
settlement that ends a published turn is written by `SqlStore.append` in the turn's own
transaction (`TaskStatements.settle`), so the transcript and the Task never disagree.

This module holds the operations on those rows; what they are built from lives apart:
the Task rows' statements (`_task_sql`), the runtime rows' (`_runtime_sql`), a row as its frozen
snapshot (`_task_snapshots`) and the kept connection of the point reads (`_point_reader`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any, TypeVar

from sqlalchemy import func, select

from controlplane.contract import RuntimeInfo, TaskSnapshot, TaskStatus, Usage, utcnow
from persistence import _runtime_sql as runtime_sql
from persistence import _task_sql as task_sql
from persistence._children_sql import held_claims
from persistence._database import Database
from persistence._deadlines import unqueued
from persistence._host_clock import LeaseNow, boot_seconds
from persistence._point_reader import PointReader
from persistence._runtime_sql import SUSPECT_COLUMNS
from persistence._schema import (
    sqlite_time,
    utc_time,
)
from persistence._task_snapshots import snapshot_of, snapshot_of_columns
from persistence._task_sql import Settlement, admit_params
from persistence._turn_usage import open_turn_usage

__all__ = ["TaskLedger"]

T = TypeVar("T")
Runner = Callable[[str, Callable[[int], Any]], Any]

_RUNNING = TaskStatus.RUNNING.value


class TaskLedger:
    """The store's Task and runtime rows. Every operation is one short transaction, run
    under the store's retry policy (``run``)."""

    def __init__(self, db: Database, run: Runner, settle: Callable[[Settlement], bool]) -> None:
        self._db = db
        self._runner = run
        self._settle = settle
        self._server_clock = db.sql.dialect.server_clock
        self._reader = PointReader(db)
        self._columns = list(task_sql.task_table.columns)

    def without_spend(self) -> None:
        """Read a store older than version 7 as it is: its Task rows have no ``spend``
        (they read as spending nothing)."""
        self._columns = [c for c in self._columns if c.name not in ("spend", "recoveries")]

    def without_recoveries(self) -> None:
        """Read a store older than version 12 as it is: its Task rows have no
        ``recoveries`` (they read as never recovered)."""
        self._columns = [c for c in self._columns if c.name != "recoveries"]

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
                    heartbeat_boot_s=self._boot_now(),
                )
                if conn.execute(runtime_sql.known(runtime_id)).first() is None:
                    # A retry may find it written.
                    row = info.model_dump(exclude={"closed_at", "running_tasks"})
                    conn.execute(runtime_sql.register(row))
            return info

        return self._run(f"register runtime {runtime_id}", op)

    def heartbeat(self, runtime_id: str) -> bool:
        """Renew a runtime's heartbeat; False if it is closed (or unknown).

        It never waits for a pooled connection (`unqueued`): calls stuck on a silent
        network hold the pool until their deadlines, and the renewal that would ride the
        outage through must go out the moment it heals."""

        on_server_clock = self._db.sql.runtimes.renew  # one statement, never back

        def op(_attempt: int) -> bool:
            if on_server_clock is not None:
                with unqueued(), self._db.cursor(write=True, begin=False) as cursor:
                    cursor.execute(on_server_clock, (runtime_id,))
                    return bool(cursor.rowcount)
            # This host's clock (SQLite: one host shares the file), under the write lock.
            with unqueued(), self._db.connection(write=True) as conn:
                renew = runtime_sql.renew(runtime_id, utcnow(), boot_seconds(), never_back=False)
                return bool(conn.execute(renew).rowcount)

        return self._run(f"renew runtime {runtime_id}", op)

    def close_runtime(self, runtime_id: str) -> None:
        """Mark a runtime closed: from now on it is dead to every other runtime."""

        def op(_attempt: int) -> None:
            with self._db.connection(write=True) as conn:
                conn.execute(runtime_sql.close(runtime_id, self._now(conn)))

        self._run(f"close runtime {runtime_id}", op)

    def runtimes(self) -> list[RuntimeInfo]:
        """Every runtime the store knows, oldest first, with its count of running Tasks."""
        query = runtime_sql.with_running()

        def op(_attempt: int) -> list[RuntimeInfo]:
            with self._db.connection(write=False) as conn:
                return [_runtime(row, int(row.running)) for row in conn.execute(query)]

        return self._run("list runtimes", op)

    def runtime(self, runtime_id: str) -> RuntimeInfo | None:
        """One runtime by id, with its count of running Tasks; None if the store has no
        such runtime (a kill of a Task held elsewhere reads the one it needs)."""
        query = runtime_sql.one_with_running(runtime_id)

        def op(_attempt: int) -> RuntimeInfo | None:
            with self._db.connection(write=False) as conn:
                row = conn.execute(query).first()
            return None if row is None else _runtime(row, int(row.running))

        return self._run(f"read runtime {runtime_id}", op)

    def lease(self, runtime_id: str) -> tuple[RuntimeInfo, LeaseNow] | None:
        """One runtime's row, read by its key, and the clock its lease is judged on, in one
        statement; None if the store has no such runtime. A forward asks this of its target
        every poll: its cost must not grow with the runtimes the store has known. The
        row's ``running_tasks`` is not counted (0)."""
        query = runtime_sql.lease(runtime_id, server_clock=self._server_clock)

        def op(_attempt: int) -> tuple[RuntimeInfo, LeaseNow] | None:
            with self._db.connection(write=False) as conn:
                row = conn.execute(query).first()
                if row is None:
                    return None
                now = utc_time(row.db_now) if self._server_clock else self._now(conn)
            return _runtime(row, 0), self.lease_now(now)

        return self._run(f"read runtime {runtime_id}", op)

    def now(self) -> LeaseNow:
        """Now on the clocks leases are judged by (`lease_now`)."""

        def op(_attempt: int) -> LeaseNow:
            with self._db.connection(write=False) as conn:
                return self.lease_now(self._now(conn))

        return self._run("read the clock", op)

    def expire_runtimes(self, gone: Sequence[RuntimeInfo]) -> int:
        """Delete the rows of runtimes dead for good that nothing refers to any more; how
        many went. A row stays while a running Task names it (the sweep, which finds those
        through the row, settles them first), and if it renewed since it was read (it was
        not dead). A claim left naming a deleted runtime is taken over as a dead one's (a
        holder missing from the store is dead to `Claims`): no index on the children's
        claims is scanned here every heartbeat."""

        def op(_attempt: int) -> int:
            deleted = 0
            with self._db.connection(write=True) as conn:
                for runtime in gone:
                    expire = runtime_sql.expire(runtime.runtime_id, runtime.heartbeat_at)
                    result = conn.execute(expire)
                    deleted += result.rowcount
            return deleted

        return self._run(f"expire {len(gone)} dead runtime(s)", op)

    def claims(self) -> dict[str, list[tuple[str, str | None, int]]]:
        """Which runtime holds which child: runtime id → ``(child id, Task id, fencing
        number)`` for every claimed child."""
        query = held_claims()

        def op(_attempt: int) -> dict[str, list[tuple[str, str | None, int]]]:
            held: dict[str, list[tuple[str, str | None, int]]] = {}
            with self._db.connection(write=False) as conn:
                for runtime_id, child_id, task_id, fence in conn.execute(query):
                    held.setdefault(str(runtime_id), []).append((child_id, task_id, int(fence)))
            return held

        return self._run("list claims", op)

    def suspects(self) -> tuple[LeaseNow, list[RuntimeInfo]]:
        """Now on the clocks leases are judged by (`lease_now`), and every runtime that
        still has a running Task: those closed or whose lease lapsed are dead to
        everyone. (A runtime whose process is gone is recognised by the caller, which
        knows its own host.)"""
        # Compiled once per process, on a cursor: a runtime reads this when it opens,
        # beside the first resumes of its children.
        sql = self._db.sql.runtimes

        def op(_attempt: int) -> tuple[LeaseNow, list[RuntimeInfo]]:
            with self._db.cursor(write=False) as cursor:
                if sql.now is None:
                    wall = utcnow()
                else:
                    cursor.execute(sql.now, ())
                    wall = utc_time(cursor.fetchall()[0][0])
                cursor.execute(sql.suspects, ())
                rows = cursor.fetchall()
            return self.lease_now(wall), [_runtime(_suspect(row), 0) for row in rows]

        return self._run("find dead runtimes", op)

    # -- tasks -----------------------------------------------------------------------

    def admit(self, task: TaskSnapshot) -> None:
        """Write a Task that has just been admitted (running). On a start's path: one
        hand-written statement on a cursor, not the ORM (8x the cost, measured)."""
        params = admit_params(task, self._stamp(task.created_at))

        def op(attempt: int) -> None:
            with self._db.cursor(write=True) as cursor:
                if attempt > 1:
                    cursor.execute(self._db.sql.tasks.task, (task.id,))
                    if cursor.fetchone() is not None:
                        return  # our earlier attempt committed, its acknowledgement was lost
                cursor.execute(self._db.sql.tasks.admit, params)

        self._run(f"record task {task.id}", op)

    def settle(self, settlement: Settlement) -> bool:
        """Write a Task's settlement that no ``turn/end`` carried (it never published, or
        its turn's end could not be written); False if it was no longer running (settled
        before). Its child's open turn, if the Task opened it, is closed in the same
        transaction, and its claim goes with it (`persistence._claims.Claims.settle`)."""
        return self._settle(settlement)

    def forget(self, task_id: str) -> None:
        """Delete a Task that was admitted but never started (its caller was told so)."""

        def op(_attempt: int) -> None:
            with self._db.connection(write=True) as conn:
                conn.execute(task_sql.forget(task_id))

        self._run(f"forget task {task_id}", op)

    def get(self, task_id: str) -> TaskSnapshot | None:
        """One Task, or None: one statement on a cursor (a Task read from another runtime
        or from before a restart costs about what the raw select does)."""

        def op(_attempt: int) -> TaskSnapshot | None:
            row = self._reader.one(self._db.sql.tasks.task, (task_id,))
            return None if row is None else snapshot_of_columns(*row)

        return self._run(f"read task {task_id}", op)

    def owned_by(self, owner_session: str) -> list[TaskSnapshot]:
        """The owner's Tasks, oldest first."""
        query = task_sql.owned_by(self._columns, owner_session)
        return self._run("list tasks", lambda _attempt: self._select(query))

    def recent(
        self, owner_session: str | None = None, *, limit: int | None = None
    ) -> list[TaskSnapshot]:
        """Every Task (of ``owner_session`` when given), newest first, at most ``limit``."""
        query = task_sql.recent(self._columns, owner_session, limit)
        return self._run("list tasks", lambda _attempt: self._select(query))

    def running(self, runtime_ids: Sequence[str]) -> list[TaskSnapshot]:
        """The running Tasks of these runtimes, oldest first."""
        query = task_sql.running_in(self._columns, runtime_ids)
        return self._run("list running tasks", lambda _attempt: self._select(query))

    def awaiting_provider(self) -> list[TaskSnapshot]:
        """The Tasks left for a runtime with their child's provider (running with no
        runtime, their detail the provider: `persistence._claims.Claims.await_provider`),
        oldest first; read through the running Tasks' partial index, whatever the number
        of settled ones."""
        statement = self._db.sql.tasks.awaiting_provider  # compiled once per process

        def op(_attempt: int) -> list[TaskSnapshot]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(statement, ())
                return [snapshot_of_columns(*row) for row in cursor.fetchall()]

        return self._run("list tasks waiting for a provider", op)

    def drain(self, owner_session: str) -> list[TaskSnapshot]:
        """Take the owner's pending completion notices: each settled Task once, across
        every runtime (one UPDATE … RETURNING, so two drains never take the same row)."""
        statement = task_sql.take_notices(self._columns, owner_session)

        def op(_attempt: int) -> list[TaskSnapshot]:
            with self._db.connection(write=True) as conn:
                rows = conn.execute(statement).all()
            return sorted(
                (snapshot_of(row) for row in rows),
                key=lambda t: (t.settled_at or t.created_at, t.id),
            )

        return self._run("drain notices", op)

    def running_spend(self, task: TaskSnapshot) -> Usage:
        """What a running Task's turn has written so far, summed from its child's open rows
        (a Task another runtime runs: its row keeps its spend only once it settles)."""
        if task.child_id is None:
            return Usage.zero()
        child_id, statement = task.child_id, self._db.sql.children.open_rows

        def op(_attempt: int) -> Usage:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(statement, (child_id,))
                rows = list(cursor.fetchall())
            return open_turn_usage(rows, task.id)

        return self._run(f"read the spend of task {task.id}", op)

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

    def lease_now(self, wall: datetime) -> LeaseNow:
        """Now for judging leases, ``wall`` being the database's clock (PostgreSQL: that
        alone) or this host's (SQLite: with the host's boot clock, which every process on
        it shares and no wall clock moves)."""
        return LeaseNow(wall=wall) if self._server_clock else LeaseNow.here(wall)

    def _boot_now(self) -> float | None:
        return None if self._server_clock else boot_seconds()

    def _now(self, conn: Any) -> datetime:
        """The database's clock on PostgreSQL (hosts' clocks may drift apart; the shared
        server's is one for all); this host's on SQLite, which only one host shares."""
        if self._server_clock:
            return utc_time(conn.execute(select(func.now())).scalar_one())
        return utcnow()


def _suspect(row: Sequence[Any]) -> SimpleNamespace:
    """A row of `RuntimeStatements.suspects`, read by name as a SQLAlchemy row is."""
    return SimpleNamespace(**dict(zip(SUSPECT_COLUMNS, row, strict=True)))


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
        heartbeat_boot_s=row.heartbeat_boot_s,
    )
