"""The raw-cursor statements of the runtime rows (`runtimes_table`) that a claim reads under
a child's lock (`persistence._claims`), and those of the wake-ups for work another runtime
can take (`persistence._takeable`); and, built in Core on each call, the runtimes' own
reads and writes, which the Task ledger (`persistence._ledger`) runs through SQLAlchemy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    Select,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    text,
    union_all,
    update,
)

from controlplane.contract import TaskStatus
from persistence._dialect import SqlDialect, constant
from persistence._schema import RUNNING_TASK, runtimes_table, tasks_table
from persistence._task_sql import running_count, running_counts, running_of

__all__ = [
    "SUSPECT_COLUMNS",
    "TAKEABLE_CHANNEL",
    "RuntimeStatements",
    "close",
    "expire",
    "known",
    "lease",
    "one_with_running",
    "register",
    "renew",
    "runtime_table",
    "with_running",
]

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
    renew: str | None
    """Renew an open runtime's heartbeat to the database's clock, never back, in one
    statement that commits on its own (takes runtime id); None where each host judges by
    its own clock (SQLite: `renew`, through SQLAlchemy). One round trip: the renewal that
    rides an outage through goes out at the heal, and every round trip on a slow link
    (BEGIN, reading the clock, COMMIT) is taken from the margin before the fence."""

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
            renew=(
                dialect.compile(
                    renew(bindparam("runtime_id"), func.now(), null(), never_back=True),
                    "runtime_id",
                )
                if dialect.server_clock
                else None
            ),
        )


# -- the runtime rows' own reads and writes ----------------------------------------------
# Built in Core on each call and run through SQLAlchemy by the Task ledger
# (`persistence._ledger`): a registration, a heartbeat, a close, the runtimes' lists; none
# is on a turn's path.

_R: Final = runtime_table.c


def known(runtime_id: str) -> Select[Any]:
    """One runtime's id, if the store has its row."""
    return select(_R.runtime_id).where(_R.runtime_id == runtime_id)


def register(row: dict[str, Any]) -> Any:
    """Insert a runtime's row (``row``: its columns by name)."""
    return insert(runtime_table).values(row)


def renew(runtime_id: Any, now: Any, boot_s: Any, *, never_back: bool) -> Any:
    """Renew an open runtime's heartbeat to ``now``; ``never_back``: to the later of the
    stored one and ``now`` (two renewals in flight may commit out of order, and the
    runtime counts its lease from the later one's send). Each argument a value or any SQL
    expression (a bound parameter, to compile it once)."""
    at = func.greatest(_R.heartbeat_at, now) if never_back else now
    return (
        update(runtime_table)
        .where(_R.runtime_id == runtime_id, _R.closed_at.is_(None))
        .values(heartbeat_at=at, heartbeat_boot_s=boot_s)
    )


def close(runtime_id: str, now: Any) -> Any:
    """Mark an open runtime closed at ``now``."""
    return (
        update(runtime_table)
        .where(_R.runtime_id == runtime_id, _R.closed_at.is_(None))
        .values(closed_at=now)
    )


def with_running() -> Select[Any]:
    """Every runtime, oldest first, with its count of running Tasks (``running``)."""
    running = running_counts()
    return (
        select(*runtime_table.c, func.coalesce(running.c.n, 0).label("running"))
        .outerjoin(running, running.c.runtime_id == _R.runtime_id)
        .order_by(_R.started_at, _R.runtime_id)
    )


def one_with_running(runtime_id: str) -> Select[Any]:
    """One runtime, with its count of running Tasks (``running``)."""
    return select(*runtime_table.c, running_count(runtime_id).label("running")).where(
        _R.runtime_id == runtime_id
    )


def lease(runtime_id: str, *, server_clock: bool) -> Select[Any]:
    """One runtime's row by its key and the database's clock (``db_now``; NULL where each
    host judges by its own), in one statement."""
    clock = func.now() if server_clock else literal(None)
    return select(*runtime_table.c, clock.label("db_now")).where(_R.runtime_id == runtime_id)


def expire(runtime_id: str, heartbeat_at: Any) -> Any:
    """Delete a dead runtime's row, unless it renewed since ``heartbeat_at`` or a running
    Task still names it."""
    return delete(runtime_table).where(
        _R.runtime_id == runtime_id,
        _R.heartbeat_at <= heartbeat_at,
        ~exists(running_of(runtime_id)),
    )
