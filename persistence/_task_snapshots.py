"""A stored Task row as the frozen `TaskSnapshot` callers see, built without validation.

A Task read by id is on a caller's path, and pydantic's validation (or its
`model_construct`) cost more than the primary-key select itself (measured). Every value
here comes from a row this store wrote from a validated snapshot, so the model is built
by setting its slots directly (`persistence._codec.construct`, as `load` builds events),
from the column list kept here beside the function that reads it by position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controlplane.contract import ErrorCode, TaskOutcome, TaskSnapshot, TaskStatus
from persistence._codec import construct
from persistence._times import utc_time
from persistence._turn_usage import stored_usage

if TYPE_CHECKING:
    from sqlalchemy import Row

__all__ = [
    "TASK_COLUMNS",
    "TASK_COLUMNS_BEFORE_RECOVERIES",
    "TASK_COLUMNS_BEFORE_SPEND",
    "snapshot_of",
    "snapshot_of_columns",
]

TASK_COLUMNS = (
    "task_id", "label", "owner_session", "child_id", "runtime_id", "status", "output",
    "detail", "code", "created_at", "settled_at", "spend", "recoveries",
)  # fmt: skip
"""What a Task's snapshot is built from, in `snapshot_of_columns`'s order (``kind`` is
always ``subagent``)."""
TASK_COLUMNS_BEFORE_RECOVERIES = TASK_COLUMNS[:-1]
"""The same, for a store older than version 12 read as it is (no ``recoveries``)."""
TASK_COLUMNS_BEFORE_SPEND = TASK_COLUMNS_BEFORE_RECOVERIES[:-1]
"""The same, for a store older than version 7 read as it is (no ``spend`` column)."""


def snapshot_of(row: Row[Any]) -> TaskSnapshot:
    """A Task row, read by name, as the frozen snapshot callers see."""
    return snapshot_of_columns(
        row.task_id, row.label, row.owner_session, row.child_id, row.runtime_id, row.status,
        row.output, row.detail, row.code, row.created_at, row.settled_at,
        getattr(row, "spend", None),  # a store older than version 7, read as it is: none
        getattr(row, "recoveries", 0),  # older than version 11: never recovered
    )  # fmt: skip


def snapshot_of_columns(
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
    spend: object = None,
    recoveries: object = 0,
) -> TaskSnapshot:
    """A Task's `TASK_COLUMNS` as its frozen snapshot, built without validation: every
    value comes from a row this store wrote from a validated snapshot
    (`persistence._codec.construct`)."""
    status = _STATUSES[status_value]
    waiting_for = None
    if status is TaskStatus.RUNNING and detail is not None and not runtime_id:
        # Left for a runtime with its child's provider (`persistence._claims.Claims.
        # await_provider`): no runtime runs it, and it waits for that provider.
        status, waiting_for = TaskStatus.QUEUED, detail
    outcome = None
    if status.is_terminal:
        outcome = construct(
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
    return construct(
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
            "usage": stored_usage(spend),
            # Filled in from the admission queue by whoever shows a queued Task.
            "queue_position": None,
            "queued_at": None,
            "admitted_at": None,
            # Filled in from the approval requests by whoever shows a waiting Task.
            "request": None,
            "recoveries": int(recoveries) if isinstance(recoveries, int) else 0,
            "waiting_for": waiting_for,
        },
        _SNAPSHOT_SET,
    )


_STATUSES = {status.value: status for status in TaskStatus}
_CODES = {code.value: code for code in ErrorCode}
_KIND = TaskSnapshot.model_fields["kind"].default
_OUTCOME_SET = frozenset(TaskOutcome.model_fields)
_SNAPSHOT_SET = frozenset(TaskSnapshot.model_fields) - {"kind"}
