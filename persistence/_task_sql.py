"""The Task rows' hand-written SQL and the parameters it takes.

A new child's start admits its Task, and a published turn settles its Task, on a raw
cursor rather than through the ORM (the ORM costs several times the statement, measured).
The statements live here, apart from `TaskLedger`, because three writers share them: the
ledger's own admission, the claims' start and resume (`persistence._claims`), and the
append that settles a turn in its own transaction (`SqlStore.append`). Each takes the
driver's placeholder, so one text serves both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import TaskOutcome, TaskSnapshot, TaskStatus
from persistence._schema import CHILDREN, TASKS
from persistence._task_snapshots import (
    TASK_COLUMNS,
    TASK_COLUMNS_BEFORE_RECOVERIES,
    TASK_COLUMNS_BEFORE_SPEND,
)

__all__ = [
    "Fence",
    "Settlement",
    "TaskStatements",
    "TxStep",
    "admit_params",
    "release_sql",
    "settle_params",
    "settle_sql",
    "spend_sql",
]

Settlement = tuple[str, TaskOutcome, datetime]
"""A Task's settlement to write: its id, its outcome, when it settled."""

Fence = tuple[str, int]
"""A writer's claim on a child: its runtime id and the fencing number it claimed under."""

TxStep = Callable[[DBAPICursor], None]
"""More statements to run in an append's transaction, on its cursor (`SqlStore.append`)."""

_RUNNING = TaskStatus.RUNNING.value
_QUEUED = TaskStatus.QUEUED.value
_INPUT_REQUIRED = TaskStatus.INPUT_REQUIRED.value


def settle_sql(p: str) -> str:
    """The Task settlement as one raw statement with placeholder ``p``: it changes a
    running Task only (or queued, or waiting for an answer: a kill, a close, a takeover),
    so a settlement is written once whoever tries it."""
    return (
        f"UPDATE {TASKS} SET status = {p}, output = {p}, detail = {p}, code = {p}, "
        f"settled_at = {p}, notice_pending = {p}, spend = {p} WHERE task_id = {p} "
        f"AND status IN ({p}, '{_QUEUED}', '{_INPUT_REQUIRED}')"
    )


def release_sql(p: str) -> str:
    """Release a child's claim taken under a fencing number (takes child id, number)."""
    return (
        f"UPDATE {CHILDREN} SET claim_runtime = NULL, claim_task = NULL "
        f"WHERE child_id = {p} AND fence = {p}"
    )


@dataclass(frozen=True, slots=True)
class TaskStatements:
    """The Task rows' hand-written SQL, with the driver's placeholder."""

    admit: str
    task: str
    """One Task's `TASK_COLUMNS`, by id."""

    @classmethod
    def build(cls, p: str, *, spend: bool = True, recoveries: bool = True) -> TaskStatements:
        """The statements with placeholder ``p``; without the ``spend`` column for a store
        older than version 7, without ``recoveries`` for one older than 11, read as it is."""
        return cls(
            admit=(
                f"INSERT INTO {TASKS} (task_id, kind, label, owner_session, child_id, "
                f"runtime_id, status, created_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
            ),
            task=f"SELECT {TASK_COLUMNS} FROM {TASKS} WHERE task_id = {p}"
            if spend and recoveries
            else f"SELECT {TASK_COLUMNS_BEFORE_RECOVERIES} FROM {TASKS} WHERE task_id = {p}"
            if spend
            else f"SELECT {TASK_COLUMNS_BEFORE_SPEND} FROM {TASKS} WHERE task_id = {p}",
        )


def admit_params(task: TaskSnapshot, stamp: Any) -> tuple[Any, ...]:
    """The parameters of `TaskStatements.admit` (``stamp``: ``created_at`` for the driver)."""
    return (task.id, task.kind, task.label, task.owner_session, task.child_id,
            task.runtime_id or "", _RUNNING, stamp)  # fmt: skip


def settle_params(
    settlement: Settlement, stamp: object, spend: str | None = None
) -> tuple[Any, ...]:
    """The parameters of `settle_sql` (``stamp`` is ``settled_at`` as the driver takes it,
    ``spend`` the turn's usage as `persistence._turn_usage.usage_column` writes it)."""
    task_id, outcome, _when = settlement
    code = outcome.code.value if outcome.code is not None else None
    return (outcome.status.value, outcome.output, outcome.detail, code, stamp, True, spend,
            task_id, _RUNNING)  # fmt: skip


def spend_sql(p: str) -> str:
    """Write a settled Task's spend (takes spend, Task id): a settlement that closed the
    Task's turn itself sums the turn after the settlement's compare-and-set."""
    return f"UPDATE {TASKS} SET spend = {p} WHERE task_id = {p}"
