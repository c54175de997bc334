"""The statements of the Task rows (`tasks_table`), and the parameters they take.

Every statement that writes a Task row's ``status`` is here: its admission, its
settlement, the queue's ``queued``/``running`` (`persistence._queue`), an approval's
``input_required``/``running`` (`persistence._approvals`) and the claims' moves
(`persistence._claims`). They are written once in SQLAlchemy Core and compiled per
database (`TaskStatements.build`); a new child's start, a resume's admission and a
published turn's settlement run them on a raw cursor (the ORM costs several times the
statement, measured). The cold reads and writes of the rows (the ledger's lists, the
console's reads) are here too, built in Core on each call (see the section below).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    Select,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    null,
    select,
    text,
    update,
)
from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import TaskOutcome, TaskSnapshot, TaskStatus
from persistence._dialect import SqlDialect, constant, params
from persistence._schema import NOTICE_PENDING, RUNNING_TASK, children_table, tasks_table
from persistence._task_snapshots import (
    TASK_COLUMNS,
    TASK_COLUMNS_BEFORE_RECOVERIES,
    TASK_COLUMNS_BEFORE_SPEND,
)

__all__ = [
    "IS_RUNNING",
    "Fence",
    "Settlement",
    "TaskStatements",
    "TxStep",
    "admit_params",
    "by_ids",
    "forget",
    "of_child",
    "owned_by",
    "recent",
    "running_count",
    "running_counts",
    "running_in",
    "running_of",
    "settle_params",
    "take_notices",
    "task_table",
]

Settlement = tuple[str, TaskOutcome, datetime]
"""A Task's settlement to write: its id, its outcome, when it settled."""

Fence = tuple[str, int]
"""A writer's claim on a child: its runtime id and the fencing number it claimed under."""

TxStep = Callable[[DBAPICursor], None]
"""More statements to run in an append's transaction, on its cursor (`SqlStore.append`)."""

task_table: Final = tasks_table

_RUNNING = TaskStatus.RUNNING.value
_QUEUED = TaskStatus.QUEUED.value
_INPUT_REQUIRED = TaskStatus.INPUT_REQUIRED.value
_ADMIT: Final = (
    "task_id", "kind", "label", "owner_session", "child_id", "runtime_id", "status",
    "created_at",
)  # fmt: skip
_SETTLE: Final = ("status", "output", "detail", "code", "settled_at", "notice_pending", "spend")


@dataclass(frozen=True, slots=True)
class TaskStatements:
    """The Task rows' statements, compiled for one database."""

    admit: str
    task: str
    """One Task's `TASK_COLUMNS`, by id."""
    settle: str
    """The Task settlement: it changes a running Task only (or queued, or waiting for an
    answer: a kill, a close, a takeover), so a settlement is written once whoever tries it
    (takes `settle_params`)."""
    spend: str
    """Write a settled Task's spend (takes spend, Task id): a settlement that closed the
    Task's turn itself sums the turn after the settlement's compare-and-set."""
    status: str
    """A Task's status (takes Task id)."""
    child: str
    """A Task's child id (takes Task id)."""
    label: str
    """A Task's label (takes Task id)."""
    runtime: str
    """The runtime a Task's row names (takes Task id)."""
    moved: str
    """A waiting Task's row names the runtime that continues it (takes runtime, Task id)."""
    queued: str
    """A running Task waits in the admission queue (takes Task id)."""
    running: str
    """A queued Task was admitted (takes Task id)."""
    adopt: str
    """A queued Task of a dead runtime moves to a live one (takes runtime, Task id, dead
    runtime)."""
    asks: str
    """A running Task waits on an approval request (takes Task id)."""
    resumes: str
    """A Task whose approval request was answered runs again (takes Task id)."""
    newest: str
    """The newest Task of each child, its `TASK_COLUMNS` (no parameters): one seek per
    child in the child's index (`NEWEST_TASK_INDEX`, which covers the inner query), then
    those Tasks by primary key, in one statement; it costs the same however many Tasks
    have settled (the console's overview, `persistence._overview`)."""
    task_keys: str
    """Every child's Tasks' (child, time, id), for a store older than the index: narrow
    enough that picking the newest in Python beats sorting whole rows in the database (a
    window function over 10,000 rows: 3-4x the time, measured). No parameters."""
    recovered: str
    """A running Task taken over: its runtime and recovery count (takes runtime, count,
    Task id)."""
    await_provider: str
    """A running Task waits for a runtime with a provider: its row names no runtime and
    the provider as its detail, so it reads ``queued`` (takes provider, Task id)."""
    take_waiting: str
    """A Task that waited for a provider runs in a runtime (takes runtime, Task id)."""
    awaiting_provider: str
    """The Tasks waiting for a runtime with their child's provider, their `TASK_COLUMNS`,
    oldest first, through the running Tasks' partial index (no parameters): a runtime
    reads them when it opens and whenever a provider registers."""

    @classmethod
    def build(
        cls, dialect: SqlDialect, *, spend: bool = True, recoveries: bool = True
    ) -> TaskStatements:
        """The statements for ``dialect``; without the ``spend`` column for a store older
        than version 7, without ``recoveries`` for one older than 12, read as it is."""
        t = task_table.c
        compile_ = dialect.compile
        by_id = t.task_id == bindparam("task_id")
        columns = (
            TASK_COLUMNS
            if spend and recoveries
            else TASK_COLUMNS_BEFORE_RECOVERIES
            if spend
            else TASK_COLUMNS_BEFORE_SPEND
        )
        waiting = t.status.in_([constant(_INPUT_REQUIRED), constant(_RUNNING)])

        def set_status(status: str, where: Any) -> str:
            statement = update(task_table).values(status=constant(status)).where(by_id, where)
            return compile_(statement, "task_id")

        return cls(
            # ``recoveries`` written as the constant 0 (its default), not bound.
            admit=compile_(
                insert(task_table).values(**params(*_ADMIT), recoveries=literal_column("0")),
                *_ADMIT,
            ),
            task=compile_(select(*(t[name] for name in columns)).where(by_id), "task_id"),
            settle=compile_(
                update(task_table)
                .values(**params(*_SETTLE))
                .where(
                    by_id,
                    t.status.in_(
                        [bindparam("running"), constant(_QUEUED), constant(_INPUT_REQUIRED)]
                    ),
                ),
                *_SETTLE,
                "task_id",
                "running",
            ),
            spend=compile_(
                update(task_table).values(**params("spend")).where(by_id), "spend", "task_id"
            ),
            status=compile_(select(t.status).where(by_id), "task_id"),
            child=compile_(select(t.child_id).where(by_id), "task_id"),
            label=compile_(select(t.label).where(by_id), "task_id"),
            runtime=compile_(select(t.runtime_id).where(by_id), "task_id"),
            moved=compile_(
                update(task_table).values(**params("runtime_id")).where(by_id, waiting),
                "runtime_id",
                "task_id",
            ),
            queued=set_status(_QUEUED, t.status == constant(_RUNNING)),
            running=set_status(_RUNNING, t.status == constant(_QUEUED)),
            adopt=compile_(
                update(task_table)
                .values(**params("runtime_id"))
                .where(by_id, t.runtime_id == bindparam("dead"), t.status == constant(_QUEUED)),
                "runtime_id",
                "task_id",
                "dead",
            ),
            asks=set_status(_INPUT_REQUIRED, waiting),
            resumes=set_status(_RUNNING, t.status == constant(_INPUT_REQUIRED)),
            newest=compile_(
                select(*(t[name] for name in columns)).where(
                    t.task_id.in_(select(_newest_of_child()).select_from(children_table))
                )
            ),
            task_keys=compile_(
                select(t.child_id, t.created_at, t.task_id).where(t.child_id.is_not(None))
            ),
            recovered=compile_(
                update(task_table)
                .values(**params("runtime_id", "recoveries"))
                .where(by_id, t.status == constant(_RUNNING)),
                "runtime_id",
                "recoveries",
                "task_id",
            ),
            # Left for a runtime with the child's provider: no runtime, the provider as its
            # detail (it reads ``queued``), still ``running`` in the column, so the running
            # Tasks' partial index finds it.
            await_provider=compile_(
                update(task_table)
                .values(runtime_id=constant(""), detail=bindparam("detail"))
                .where(by_id, t.status == constant(_RUNNING)),
                "detail",
                "task_id",
            ),
            take_waiting=compile_(
                update(task_table)
                .values(runtime_id=bindparam("runtime_id"), detail=null())
                .where(
                    by_id,
                    t.status == constant(_RUNNING),
                    t.runtime_id == constant(""),
                    t.detail.is_not(None),
                ),
                "runtime_id",
                "task_id",
            ),
            awaiting_provider=compile_(
                select(*(t[name] for name in columns))
                .where(text(RUNNING_TASK), t.runtime_id == constant(""), t.detail.is_not(None))
                .order_by(t.created_at)
            ),
        )


def _newest_of_child() -> Any:
    """The id of the newest Task of the child of the enclosing query's row."""
    newest = task_table.alias("newest")
    return (
        select(newest.c.task_id)
        .where(newest.c.child_id == children_table.c.child_id)
        .order_by(newest.c.created_at.desc(), newest.c.task_id.desc())
        .limit(literal_column("1"))
        .offset(literal_column("0"))  # written, not bound (SQLite's LIMIT takes an OFFSET)
        .correlate(children_table)
        .scalar_subquery()
    )


def admit_params(task: TaskSnapshot, stamp: Any) -> tuple[Any, ...]:
    """The parameters of `TaskStatements.admit` (``stamp``: ``created_at`` for the driver)."""
    return (task.id, task.kind, task.label, task.owner_session, task.child_id,
            task.runtime_id or "", _RUNNING, stamp)  # fmt: skip


def settle_params(
    settlement: Settlement, stamp: object, spend: str | None = None
) -> tuple[Any, ...]:
    """The parameters of `TaskStatements.settle` (``stamp`` is ``settled_at`` as the
    driver takes it, ``spend`` the turn's usage as `persistence._turn_usage.usage_column`
    writes it)."""
    task_id, outcome, _when = settlement
    code = outcome.code.value if outcome.code is not None else None
    return (outcome.status.value, outcome.output, outcome.detail, code, stamp, True, spend,
            task_id, _RUNNING)  # fmt: skip


# -- cold-path statements ----------------------------------------------------------------
# Built in Core on each call and run through SQLAlchemy (rows read by name, stored times
# converted by the dialect): each takes a value that changes per call (a list of ids, a
# limit, the columns a store's version has) and none is on a hot path, so compiling it to
# text once would save nothing measured. ``columns`` is the reader's `Column` list (fewer
# for a store older than the ``spend`` or ``recoveries`` columns).

IS_RUNNING: Final = text(RUNNING_TASK)
"""The running Tasks' partial index's own predicate, as a literal: a bound parameter would
hide from the planner that a query only wants the rows the index holds."""
_HAS_NOTICE: Final = text(NOTICE_PENDING)
_T: Final = task_table.c


def owned_by(columns: Sequence[Any], owner_session: str) -> Select[Any]:
    """The owner's Tasks, oldest first."""
    return (
        select(*columns)
        .where(_T.owner_session == owner_session)
        .order_by(_T.created_at, _T.task_id)
    )


def recent(columns: Sequence[Any], owner_session: str | None, limit: int | None) -> Select[Any]:
    """Every Task (of ``owner_session`` when given), newest first, at most ``limit``."""
    query = select(*columns).order_by(_T.created_at.desc(), _T.task_id.desc())
    if owner_session is not None:
        query = query.where(_T.owner_session == owner_session)
    if limit is not None:
        query = query.limit(limit)
    return query


def running_in(columns: Sequence[Any], runtime_ids: Sequence[str]) -> Select[Any]:
    """The running Tasks of these runtimes, oldest first (through the partial index)."""
    return (
        select(*columns)
        .where(IS_RUNNING, _T.runtime_id.in_(list(runtime_ids)))
        .order_by(_T.created_at)
    )


def take_notices(columns: Sequence[Any], owner_session: str) -> Any:
    """Take the owner's pending completion notices, returning their Tasks: one UPDATE …
    RETURNING, so two drains never take the same row."""
    return (
        update(task_table)
        .where(_T.owner_session == owner_session, _HAS_NOTICE)
        .values(notice_pending=None)
        .returning(*columns)
    )


def forget(task_id: str) -> Any:
    """Delete one Task's row."""
    return delete(task_table).where(_T.task_id == task_id)


def by_ids(columns: Sequence[Any], task_ids: Sequence[str]) -> Select[Any]:
    """These Tasks (a bounded list of ids: the caller batches)."""
    return select(*columns).where(_T.task_id.in_(list(task_ids)))


def of_child(columns: Sequence[Any], child_id: str) -> Select[Any]:
    """One child's Tasks, newest first."""
    return (
        select(*columns)
        .where(_T.child_id == child_id)
        .order_by(_T.created_at.desc(), _T.task_id.desc())
    )


def running_of(runtime_id: str) -> Select[Any]:
    """The ids of one runtime's running Tasks (through the partial index)."""
    return select(_T.task_id).where(IS_RUNNING, _T.runtime_id == runtime_id)


def running_counts() -> Any:
    """Each runtime's count of running Tasks (``runtime_id``, ``n``), as a subquery."""
    return (
        select(_T.runtime_id, func.count().label("n"))
        .where(IS_RUNNING)
        .group_by(_T.runtime_id)
        .subquery()
    )


def running_count(runtime_id: str) -> Any:
    """One runtime's count of running Tasks, as a scalar subquery."""
    return (
        select(func.count())
        .select_from(task_table)
        .where(IS_RUNNING, _T.runtime_id == runtime_id)
        .scalar_subquery()
    )
