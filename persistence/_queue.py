"""The durable FIFO queue of concurrency limits.

A Task whose activation falls under a limited key (a provider name, or
``"provider:model"``) has one `admissions_table` row per key. Every decision is one short write
transaction under the key's lock (PostgreSQL: a transaction-scoped advisory lock per key,
taken in key order; SQLite: the one writer ``BEGIN IMMEDIATE`` admits), so runtimes on
one store never admit more than the limit between them:

- a slot is taken by a ``running`` row whose Task still runs (joined with the Task row:
  a Task settled by any means — its turn's end, a sweep of its dead runtime, a takeover —
  frees its slot in the transaction that settles it, before its row is deleted);
- a Task is admitted when, under each of its keys, fewer than the limit hold a slot and
  its row is the oldest queued one whose Task is still queued (FIFO across runtimes);
- the Task row reads ``queued`` while it waits and ``running`` once admitted, in the
  transaction that decides.

A row carries the plan a live runtime needs to start the Task itself when the runtime that
holds it died while it was queued (`AdmissionQueue.adopt`). On PostgreSQL a release
notifies every listening runtime (`NOTIFY`); every waiting runtime also polls, bounded.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import and_, delete, func, select
from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import TaskSnapshot, TaskStatus, utcnow
from persistence._queue_sql import CHANNEL
from persistence._schema import admissions_table, tasks_table

if TYPE_CHECKING:
    from persistence._port import StorePort
    from persistence._queue_listener import AdmissionListener

__all__ = ["CHANNEL", "AdmissionQueue", "Admitted", "QueueHead", "QueuePlace"]

log = logging.getLogger(__name__)
T = TypeVar("T")

"""The PostgreSQL channel a release notifies: one for every runtime on the store."""
_LOCK_SPACE = 0x5AB_AD31  # the advisory locks' first key: any constant every process shares
_QUEUED = TaskStatus.QUEUED.value
_RUNNING = TaskStatus.RUNNING.value
_A = admissions_table.c
_T = tasks_table.c


class Admitted(Enum):
    """What an admission attempt found."""

    NOW = "now"  # the Task holds its slots (now, or already)
    WAIT = "wait"  # no room yet, or older Tasks wait first
    GONE = "gone"  # the Task has no queue rows, or it settled (killed, interrupted)


@dataclass(frozen=True, slots=True)
class QueuePlace:
    """A Task's place in the queue: 1-based position (None once admitted), and times."""

    position: int | None
    queued_at: datetime
    admitted_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueueHead:
    """The oldest queued Task under a key whose Task is still queued."""

    task_id: str
    key: str
    runtime_id: str
    child_id: str
    plan: str
    seq: int


class AdmissionQueue:
    """The store's admission rows. Every operation is one short transaction, run under the
    store's retry policy."""

    def __init__(self, port: StorePort) -> None:
        self._s = port
        self._db = port.db
        self._notifies = port.dialect.notifies

    # -- decisions ---------------------------------------------------------------------

    def enter(
        self,
        task_id: str,
        *,
        child_id: str,
        runtime_id: str,
        keys: Iterable[str],
        limits: Mapping[str, int],
        plan: str,
    ) -> tuple[Admitted, int]:
        """Queue a Task under ``keys`` and admit it at once if there is room and nobody
        waits before it; else its Task row reads ``queued``. Idempotent on retry.
        Returns the decision and the Task's place in the store's order (``seq``)."""
        keys = sorted(set(keys))
        sql, tasks = self._db.sql.queue, self._db.sql.tasks

        def op(_attempt: int) -> tuple[Admitted, int]:
            with self._db.cursor(write=True) as cursor:
                self._lock(cursor, keys)
                cursor.execute(sql.first_seq, (task_id,))
                (seq,) = cursor.fetchone() or (None,)
                if seq is None:  # not written by an earlier attempt whose commit was lost
                    now = self._s.stamp(utcnow())
                    for key in keys:
                        cursor.execute(sql.insert, (task_id, key, runtime_id, child_id, now, plan))
                    cursor.execute(sql.first_seq, (task_id,))
                    (seq,) = cursor.fetchone() or (None,)
                # Its Task row reads queued until the decision below says otherwise.
                assert seq is not None  # written above, in this transaction
                cursor.execute(tasks.queued, (task_id,))
                return self._try(cursor, task_id, limits, locked=True), int(seq)

        return self._run(f"queue task {task_id}", op)

    def admit(self, task_id: str, limits: Mapping[str, int]) -> Admitted:
        """Give the Task its slots if there is room and it is first in line."""

        def op(_attempt: int) -> Admitted:
            with self._db.cursor(write=True) as cursor:
                return self._try(cursor, task_id, limits, locked=False)

        return self._run(f"admit task {task_id}", op)

    def release(
        self,
        task_id: str,
        *,
        waiting: Sequence[tuple[str, frozenset[str]]] = (),
        limits: Mapping[str, int] | None = None,
    ) -> list[tuple[str, Admitted]]:
        """Forget a Task's rows (it settled, or never ran): its slot or place is free, and
        every listening runtime hears so (PostgreSQL). In the same transaction, admit what
        of ``waiting`` (the releasing runtime's own waiting Tasks and their keys, in the
        store's order) can now run: a slot freed here is taken here without another
        round trip. Returns those decided (admitted, or gone)."""

        def op(_attempt: int) -> list[tuple[str, Admitted]]:
            decided: list[tuple[str, Admitted]] = []
            with self._db.cursor(write=True) as cursor:
                sql = self._db.sql.queue
                cursor.execute(sql.delete, (task_id,))
                released = cursor.rowcount
                full: set[str] = set()
                for waiter, keys in waiting:
                    if keys & full:
                        continue
                    found = self._try(cursor, waiter, limits or {}, locked=False)
                    if found is Admitted.WAIT:
                        full |= keys
                    else:
                        decided.append((waiter, found))
            if released:
                self._wake()  # after the commit: see `_wake`
            return decided

        return self._run(f"release the slot of task {task_id}", op)

    def adopt(self, task_id: str, *, dead: str, runtime_id: str) -> tuple[bool, int | None]:
        """Take a queued Task of the dead runtime ``dead`` over for ``runtime_id``: its
        rows, its Task row and (for a resume) its child's claim, whose fencing number
        grows, in one transaction. Returns whether it was taken (False: it is no longer
        queued there) and the new fencing number (None: the child is not stored yet, a
        start; or its claim went elsewhere, then the Task is settled ``interrupted``)."""

        sql = self._db.sql

        def op(_attempt: int) -> tuple[bool, int | None]:
            with self._db.cursor(write=True) as cursor:
                cursor.execute(sql.tasks.adopt, (runtime_id, task_id, dead))
                if cursor.rowcount != 1:
                    return False, None
                cursor.execute(sql.queue.adopt, (runtime_id, task_id))
                cursor.execute(sql.children.queued_claim, (task_id, dead))
                child = cursor.fetchone()
                if child is None:
                    return True, None
                cursor.execute(sql.children.move_queued, (runtime_id, task_id, dead))
                return True, int(child[0]) + 1

        return self._run(f"adopt queued task {task_id}", op)

    # -- reads -------------------------------------------------------------------------

    def places(self, task_ids: Iterable[str]) -> dict[str, QueuePlace]:
        """The queue places of these Tasks (only those that have rows)."""
        ids = list(task_ids)
        if not ids:
            return {}
        mine = select(_A.task_id, _A.key, _A.seq, _A.state, _A.queued_at, _A.admitted_at).where(
            _A.task_id.in_(ids)
        )

        def op(_attempt: int) -> dict[str, QueuePlace]:
            found: dict[str, QueuePlace] = {}
            with self._db.connection(write=False) as conn:
                for row in conn.execute(mine).all():
                    position = None
                    if row.state == _QUEUED:
                        position = int(conn.execute(self._ahead(row.key, row.seq)).scalar_one())
                    earlier = found.get(row.task_id)
                    if (
                        earlier is not None
                        and earlier.position is not None
                        and position is not None
                    ):
                        position = max(position, earlier.position)
                    found[row.task_id] = QueuePlace(
                        position=position, queued_at=row.queued_at, admitted_at=row.admitted_at
                    )
            return found

        return self._run("read queue places", op)

    def with_places(self, snapshots: list[TaskSnapshot]) -> list[TaskSnapshot]:
        """The snapshots, each queued one with its queue position (and the time it was
        queued) filled in; one read, and none when nothing is queued."""
        queued = [s.id for s in snapshots if s.status is TaskStatus.QUEUED]
        if not queued:
            return snapshots
        found = self.places(queued)
        out = []
        for snapshot in snapshots:
            place = found.get(snapshot.id)
            if place is not None:
                snapshot = snapshot.model_copy(
                    update={
                        "queue_position": place.position,
                        "queued_at": snapshot.queued_at or place.queued_at,
                    }
                )
            out.append(snapshot)
        return out

    def heads(self) -> list[QueueHead]:
        """The first waiting Task of every key (its Task still queued)."""
        first = (
            select(_A.key, func.min(_A.seq).label("seq"))
            .join(tasks_table, _T.task_id == _A.task_id)
            .where(_A.state == _QUEUED, _T.status == _QUEUED)
            .group_by(_A.key)
            .subquery()
        )
        query = select(_A.task_id, _A.key, _A.runtime_id, _A.child_id, _A.plan, _A.seq).join(
            first, and_(first.c.key == _A.key, first.c.seq == _A.seq)
        )

        def op(_attempt: int) -> list[QueueHead]:
            with self._db.connection(write=False) as conn:
                return [QueueHead(*row) for row in conn.execute(query).all()]

        return self._run("read queue heads", op)

    def stranded(self, runtime_id: str) -> list[tuple[str, str]]:
        """``(task id, runtime id)`` of every Task queued by another runtime than
        ``runtime_id`` (the admission table is small: no scan of the Task rows)."""
        query = (
            select(_A.task_id, _A.runtime_id)
            .where(_A.state == _QUEUED, _A.runtime_id != runtime_id)
            .distinct()
        )

        def op(_attempt: int) -> list[tuple[str, str]]:
            with self._db.connection(write=False) as conn:
                return [(str(t), str(r)) for t, r in conn.execute(query).all()]

        return self._run("read queued tasks", op)

    def sweep(self) -> int:
        """Delete the rows of Tasks that settled without releasing them (their runtime
        died); how many went. They take no slot and hold no place already (joined)."""
        settled = select(_T.task_id).where(_T.status.not_in([_RUNNING, _QUEUED]))

        def op(_attempt: int) -> int:
            with self._db.connection(write=True) as conn:
                return int(
                    conn.execute(delete(admissions_table).where(_A.task_id.in_(settled))).rowcount
                )

        return self._run("sweep the admission queue", op)

    def listen(self, on_release: Callable[[], None]) -> AdmissionListener | None:
        """Hear every release on the store (PostgreSQL; None on SQLite, which polls)."""
        from persistence._queue_listener import AdmissionListener

        return AdmissionListener(self._db, on_release) if self._notifies else None

    # -- plumbing ----------------------------------------------------------------------

    def _wake(self) -> None:
        """Tell every listening runtime a slot was freed, once the write that freed it has
        committed, in a statement that writes nothing. A ``pg_notify`` inside the write
        would serialize every notifying commit of the cluster behind one lock held
        through each one's WAL flush. Best effort: a waiter that misses it polls."""
        released = self._db.sql.queue.released
        if released is None:  # SQLite: waiters poll
            return
        try:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(released, (CHANNEL,))
        except self._db.errors as exc:
            log.info("could not announce a freed slot: %s", exc)

    def _try(
        self, cursor: DBAPICursor, task_id: str, limits: Mapping[str, int], *, locked: bool
    ) -> Admitted:
        """Inside the caller's write transaction: admit the Task if, under each of its
        keys, fewer than the limit hold a slot and it is first in line."""
        sql = self._db.sql.queue
        cursor.execute(sql.rows, (task_id,))
        rows = cursor.fetchall()
        if not rows:
            return Admitted.GONE
        if not locked:
            self._lock(cursor, [row[0] for row in rows])
        if rows[0][3] not in (_QUEUED, _RUNNING):
            return Admitted.GONE  # settled meanwhile (killed, interrupted)
        if all(row[2] == _RUNNING for row in rows):
            return Admitted.NOW
        for key, seq, _state, _status in rows:
            limit = limits.get(key)
            if limit is None:
                continue  # a key this runtime does not limit: no slot to wait for
            cursor.execute(sql.room, (key, key, seq))
            holding, ahead = cursor.fetchone() or (0, 0)
            if int(holding) >= limit or int(ahead) > 1:
                return Admitted.WAIT
        cursor.execute(sql.admit, (self._s.stamp(utcnow()), task_id))
        cursor.execute(self._db.sql.tasks.running, (task_id,))
        return Admitted.NOW

    @staticmethod
    def _ahead(key: str, seq: int) -> Any:
        """The 1-based place of the row ``seq`` among ``key``'s waiting Tasks."""
        return (
            select(func.count())
            .select_from(admissions_table)
            .join(tasks_table, _T.task_id == _A.task_id)
            .where(_A.key == key, _A.state == _QUEUED, _A.seq <= seq, _T.status == _QUEUED)
        )

    def _lock(self, cursor: DBAPICursor, keys: Iterable[str]) -> None:
        """PostgreSQL: the keys' advisory locks, in key order (no deadlock). SQLite's
        write transaction already admits one writer at a time."""
        lock = self._db.sql.queue.lock
        if lock is None:
            return
        for key in sorted(set(keys)):
            cursor.execute(lock, (_LOCK_SPACE, _signed(zlib.crc32(key.encode()))))

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        return self._s.run(action, operation)


def _signed(value: int) -> int:
    """A crc32 as PostgreSQL's int4."""
    return value - (1 << 32) if value >= 1 << 31 else value
