"""The statements of the admission queue's rows (`admissions_table`), compiled per database
and run on the raw cursor by `persistence._queue` (a few statements per decision: the ORM
cost more than the statements here, measured)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, func, select, update

from controlplane.contract import TaskStatus
from persistence._dialect import SqlDialect, constant, params
from persistence._schema import admissions_table
from persistence._task_sql import task_table

__all__ = ["CHANNEL", "QueueStatements", "admission_table"]

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
