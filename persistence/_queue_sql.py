"""The statements of the admission queue's rows (`admissions_table`), compiled per database
and run on the raw cursor by `persistence._queue` (a few statements per decision: the ORM
cost more than the statements here, measured); and the queue's cold reads, built in Core on
each call and run through SQLAlchemy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Select, and_, bindparam, delete, func, select, update

from controlplane.contract import TaskStatus
from persistence._dialect import SqlDialect, constant, params
from persistence._schema import admissions_table
from persistence._task_sql import task_table

__all__ = [
    "CHANNEL",
    "QueueStatements",
    "admission_table",
    "ahead",
    "heads",
    "places_of",
    "stranded",
    "sweep",
    "unsettled_by_key",
]

admission_table: Final = admissions_table

CHANNEL: Final = "subagent_admission"
"""The channel a release notifies (PostgreSQL)."""
_QUEUED = TaskStatus.QUEUED.value
_RUNNING = TaskStatus.RUNNING.value
_INSERT: Final = ("task_id", "key", "runtime_id", "child_id", "queued_at", "plan")


@dataclass(frozen=True, slots=True)
class QueueStatements:
    """The admission rows' statements, compiled for one database."""

    first_seq: str
    insert: str
    rows: str
    room: str
    """How many hold a slot under the key, and the row's place among its waiters (takes
    key, key, seq)."""
    admit: str
    delete: str
    adopt: str
    """A dead runtime's queued Task's rows move to a live one (takes runtime, Task id)."""
    lock: str | None
    """A transaction-scoped lock on one key (takes two ints; PostgreSQL: an advisory
    lock), None where the write transaction admits one writer at a time (SQLite)."""
    released: str | None
    """Wake the listening runtimes: a slot was released (PostgreSQL; takes the channel)."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> QueueStatements:
        compile_ = dialect.compile
        a = admission_table.c
        by_task = a.task_id == bindparam("task_id")
        r, rt = admission_table.alias("r"), task_table.alias("rt")
        h, ht = admission_table.alias("h"), task_table.alias("ht")
        q, qt = admission_table.alias("q"), task_table.alias("qt")
        holding = (
            select(func.count())
            .select_from(h.join(ht, ht.c.task_id == h.c.task_id))
            .where(
                h.c.key == bindparam("key"),
                h.c.state == constant(_RUNNING),
                ht.c.status == constant(_RUNNING),
            )
            .scalar_subquery()
        )
        ahead = (
            select(func.count())
            .select_from(q.join(qt, qt.c.task_id == q.c.task_id))
            .where(
                q.c.key == bindparam("queued_key"),
                q.c.state == constant(_QUEUED),
                q.c.seq <= bindparam("seq"),
                qt.c.status == constant(_QUEUED),
            )
            .scalar_subquery()
        )
        notify = dialect.notify(bindparam("channel"), constant(""))
        return cls(
            first_seq=compile_(select(func.min(a.seq)).where(by_task), "task_id"),
            insert=compile_(
                # inline: no RETURNING of the new seq (PostgreSQL would add one).
                admission_table.insert()
                .inline()
                .values(**params(*_INSERT), state=constant(_QUEUED)),
                *_INSERT,
            ),
            rows=compile_(
                select(r.c.key, r.c.seq, r.c.state, rt.c.status)
                .select_from(r.join(rt, rt.c.task_id == r.c.task_id))
                .where(r.c.task_id == bindparam("task_id"))
                .order_by(r.c.key),
                "task_id",
            ),
            room=compile_(select(holding, ahead), "key", "queued_key", "seq"),
            admit=compile_(
                update(admission_table)
                .values(state=constant(_RUNNING), **params("admitted_at"))
                .where(by_task),
                "admitted_at",
                "task_id",
            ),
            delete=compile_(admission_table.delete().where(by_task), "task_id"),
            adopt=compile_(
                update(admission_table).values(**params("runtime_id")).where(by_task),
                "runtime_id",
                "task_id",
            ),
            lock=(
                compile_(
                    select(func.pg_advisory_xact_lock(bindparam("space"), bindparam("key"))),
                    "space",
                    "key",
                )
                if dialect.row_locks
                else None
            ),
            released=None if notify is None else compile_(select(notify), "channel"),
        )


# -- cold reads, built in Core ------------------------------------------------------------
# Run through SQLAlchemy (rows by name): the console's and a queue's reads of places and
# heads, each joined with the Task rows (`task_table`) whose status decides whether a row
# still waits; none is on an admission's path.

_A: Final = admission_table.c
_T: Final = task_table.c
_UNSETTLED: Final = (_RUNNING, _QUEUED, TaskStatus.INPUT_REQUIRED.value)


def unsettled_by_key() -> Select[Any]:
    """Every unsettled Task's admission row with the Task's status, label and child, by key
    then place."""
    return (
        select(_A.key, _A.task_id, _A.state, _A.seq, _T.status, _T.label, _T.child_id)
        .join(task_table, _T.task_id == _A.task_id)
        .where(_T.status.in_(_UNSETTLED))
        .order_by(_A.key, _A.seq)
    )


def places_of(task_ids: Sequence[str]) -> Select[Any]:
    """These Tasks' admission rows: their key, place, state and times."""
    return select(_A.task_id, _A.key, _A.seq, _A.state, _A.queued_at, _A.admitted_at).where(
        _A.task_id.in_(list(task_ids))
    )


def ahead(key: str, seq: int) -> Select[Any]:
    """The 1-based place of the row ``seq`` among ``key``'s waiting Tasks."""
    return (
        select(func.count())
        .select_from(admission_table)
        .join(task_table, _T.task_id == _A.task_id)
        .where(_A.key == key, _A.state == _QUEUED, _A.seq <= seq, _T.status == _QUEUED)
    )


def heads() -> Select[Any]:
    """The first waiting row of every key whose Task is still queued."""
    first = (
        select(_A.key, func.min(_A.seq).label("seq"))
        .join(task_table, _T.task_id == _A.task_id)
        .where(_A.state == _QUEUED, _T.status == _QUEUED)
        .group_by(_A.key)
        .subquery()
    )
    return select(_A.task_id, _A.key, _A.runtime_id, _A.child_id, _A.plan, _A.seq).join(
        first, and_(first.c.key == _A.key, first.c.seq == _A.seq)
    )


def stranded(runtime_id: str) -> Select[Any]:
    """``(task id, runtime id)`` of every Task queued by another runtime than
    ``runtime_id``."""
    return (
        select(_A.task_id, _A.runtime_id)
        .where(_A.state == _QUEUED, _A.runtime_id != runtime_id)
        .distinct()
    )


def sweep() -> Any:
    """Delete the admission rows of Tasks that settled without releasing them."""
    settled = select(_T.task_id).where(_T.status.not_in([_RUNNING, _QUEUED]))
    return delete(admission_table).where(_A.task_id.in_(settled))
