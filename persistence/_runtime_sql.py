"""The raw-cursor statements of the runtime rows (`runtimes_table`) that a claim reads under
a child's lock (`persistence._claims`), and those of the wake-ups for work another runtime
can take (`persistence._takeable`); the runtimes' own writes are the Task ledger's
(`persistence._ledger`, through SQLAlchemy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, func, select, text, union_all

from controlplane.contract import TaskStatus
from persistence._dialect import SqlDialect, constant
from persistence._schema import RUNNING_TASK, runtimes_table, tasks_table

__all__ = ["SUSPECT_COLUMNS", "TAKEABLE_CHANNEL", "RuntimeStatements", "runtime_table"]

runtime_table: Final = runtimes_table

SUSPECT_COLUMNS: Final = (
    "runtime_id",
    "host",
    "pid",
    "boot_id",
    "started_at",
    "heartbeat_at",
    "lease_ttl_s",
    "closed_at",
    "heartbeat_boot_s",
)
"""The runtime row's columns `RuntimeStatements.suspects` reads, in its order."""

TAKEABLE_CHANNEL: Final = "subagent_takeable"
"""The channel that says a Task can be taken by a runtime with its provider (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class RuntimeStatements:
    """The runtime rows' statements, compiled for one database."""

    runtime: str
    """One runtime's lease columns (takes runtime id)."""
    now: str | None
    """The database's clock, where leases are judged by it (PostgreSQL); None where each
    host judges by its own (SQLite)."""
    takeable: str
    """The running Tasks no live runtime runs: left for a runtime with their child's
    provider (no runtime on the row), or of a closed runtime (handed over); read through
    the running Tasks' partial index (no parameters)."""
    wake: str | None
    """Wake the listening runtimes: a Task can be taken (PostgreSQL; takes the channel)."""
    suspects: str
    """Every runtime that has a running Task, its `SUSPECT_COLUMNS` (no parameters)."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> RuntimeStatements:
        r = runtime_table.c
        t = tasks_table.c
        running = t.status == constant(TaskStatus.RUNNING.value)
        closed = select(r.runtime_id).where(r.closed_at.is_not(None))
        notify = dialect.notify(bindparam("channel"), constant(""))
        return cls(
            runtime=dialect.compile(
                select(
                    r.host,
                    r.pid,
                    r.boot_id,
                    r.lease_ttl_s,
                    r.started_at,
                    r.heartbeat_at,
                    r.closed_at,
                    r.heartbeat_boot_s,
                ).where(r.runtime_id == bindparam("runtime_id")),
                "runtime_id",
            ),
            now=dialect.compile(select(func.now())) if dialect.row_locks else None,
            # Two seeks in the running Tasks' index (no runtime; each closed runtime's),
            # never a scan of every running Task: a watching runtime polls this.
            takeable=dialect.compile(
                union_all(
                    select(t.task_id).where(running, t.runtime_id == constant("")),
                    select(t.task_id).where(running, t.runtime_id.in_(closed)),
                )
            ),
            wake=None if notify is None else dialect.compile(select(notify), "channel"),
            suspects=dialect.compile(
                select(*(r[name] for name in SUSPECT_COLUMNS)).where(
                    r.runtime_id.in_(select(t.runtime_id).where(text(RUNNING_TASK)).distinct())
                )
            ),
        )
