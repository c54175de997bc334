"""The one error type of the control plane and its stable codes."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ClaimConflict", "ErrorCode", "ParkedTask", "SubagentControlError"]


class ErrorCode(StrEnum):
    """Stable error codes; each value equals its name."""

    UNKNOWN_PROVIDER = "UNKNOWN_PROVIDER"
    PERSISTENCE_UNAVAILABLE = "PERSISTENCE_UNAVAILABLE"
    INVALID_DESCRIPTOR = "INVALID_DESCRIPTOR"
    NO_CONTROL_SURFACE = "NO_CONTROL_SURFACE"
    UNAUTHORIZED = "UNAUTHORIZED"
    OWNERSHIP_CONFLICT = "OWNERSHIP_CONFLICT"
    NOT_DELIVERED = "NOT_DELIVERED"
    NOT_RESUMABLE = "NOT_RESUMABLE"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    CANCELLED = "CANCELLED"
    DURABILITY_FAILED = "DURABILITY_FAILED"
    INVALID_INPUT = "INVALID_INPUT"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    CLOSED = "CLOSED"
    CHILD_NOT_FOUND = "CHILD_NOT_FOUND"
    CHILD_EXISTS = "CHILD_EXISTS"
    TIMEOUT = "TIMEOUT"
    INTERNAL = "INTERNAL"
    CAPACITY = "CAPACITY"
    FENCED = "FENCED"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    REQUEST_NOT_FOUND = "REQUEST_NOT_FOUND"
    REQUEST_CLOSED = "REQUEST_CLOSED"
    STORE_NOT_FOUND = "STORE_NOT_FOUND"


class SubagentControlError(Exception):
    """Raised for every failure the control plane reports.

    Attributes:
        code: The stable `ErrorCode`; branch on it, never on the message.
        message: What happened and what the caller can do about it.
        child_id: The child concerned, when there is one.
        task_id: The Task concerned, when there is one.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        child_id: str | None = None,
        task_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.child_id = child_id
        self.task_id = task_id

    def __str__(self) -> str:
        return f"[{self.code.value}] {self.message}"

    def __repr__(self) -> str:
        return f"SubagentControlError({self.code.value!r}, {self.message!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.code, self.message, self.child_id, self.task_id))


def _rebuild(
    code: ErrorCode, message: str, child_id: str | None, task_id: str | None
) -> SubagentControlError:
    return SubagentControlError(code, message, child_id=child_id, task_id=task_id)


class ClaimConflict(SubagentControlError):
    """``OWNERSHIP_CONFLICT`` because another live runtime holds the child's claim,
    not because a live agent here uses the child's id: on PostgreSQL the sender forwards
    the message to that runtime instead (`controlplane.runtime.routing._forwarding`).

    Attributes:
        runtime_id: The runtime that held the claim when it was read.
    """

    def __init__(self, message: str, *, child_id: str, runtime_id: str) -> None:
        super().__init__(ErrorCode.OWNERSHIP_CONFLICT, message, child_id=child_id)
        self.runtime_id = runtime_id

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_claim_conflict, (self.message, self.child_id, self.runtime_id))


def _rebuild_claim_conflict(message: str, child_id: str, runtime_id: str) -> ClaimConflict:
    return ClaimConflict(message, child_id=child_id, runtime_id=runtime_id)


class ParkedTask(SubagentControlError):
    """The child's claim belongs to a Task parked on an approval request: a
    message to the child goes into that Task's turn (the runtime continues it), never into
    a new one. Raised by the claim of a resume, which then starts nothing.

    Attributes:
        parked_task_id: The Task that waits.
    """

    def __init__(self, *, child_id: str, task_id: str) -> None:
        super().__init__(
            ErrorCode.NOT_DELIVERED,
            f"child {child_id} waits for an approval answer in task {task_id}; the message "
            "was not delivered",
            child_id=child_id,
            task_id=task_id,
        )
        self.parked_task_id = task_id

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_parked, (self.child_id, self.parked_task_id))


def _rebuild_parked(child_id: str, task_id: str) -> ParkedTask:
    return ParkedTask(child_id=child_id, task_id=task_id)
