"""A stored Task row as the frozen `TaskSnapshot` callers see, built without validation.

A Task read by id is on a caller's path, and pydantic's validation (or its
`model_construct`) cost more than the primary-key select itself (measured). Every value
here comes from a row this store wrote from a validated snapshot, so the model is built
by setting its slots directly. That trick depends on pydantic's internals, which is why it
lives on its own, next to the column list whose order it reads.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Row

from controlplane.contract import ErrorCode, TaskOutcome, TaskSnapshot, TaskStatus
from persistence._schema import utc_time

__all__ = ["TASK_COLUMNS", "snapshot_of", "snapshot_of_columns"]

TASK_COLUMNS = (
    "task_id, label, owner_session, child_id, runtime_id, status, output, detail, code, "
    "created_at, settled_at"
)
"""What a Task's snapshot is built from, in `snapshot_of_columns`'s order (``kind`` is
always ``subagent``)."""


def snapshot_of(row: Row[Any]) -> TaskSnapshot:
    """A Task row, read by name, as the frozen snapshot callers see."""
    return snapshot_of_columns(
        row.task_id, row.label, row.owner_session, row.child_id, row.runtime_id, row.status,
        row.output, row.detail, row.code, row.created_at, row.settled_at,
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
) -> TaskSnapshot:
    """A Task's `TASK_COLUMNS` as its frozen snapshot, built without validation: every
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
