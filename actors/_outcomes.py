"""How an activation's end becomes its Task's outcome: one place for the mapping of kills,
internal failures and errors, shared by the activation and its supervisor; and the
supervisor's refusal of a message it could not deliver."""

from __future__ import annotations

from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    SubagentControlError,
    TaskOutcome,
    TaskStatus,
)

__all__ = ["aborted", "error_text", "failed", "killed", "not_delivered", "unrecorded"]


def failed(detail: str, code: ErrorCode | None = None) -> TaskOutcome:
    """A ``failed`` outcome with its detail (and code, when one fits)."""
    return TaskOutcome(status=TaskStatus.FAILED, detail=detail, code=code)


def killed(reason: str | None) -> TaskOutcome:
    """A ``killed`` outcome: the detail is the kill's reason."""
    return TaskOutcome(
        status=TaskStatus.KILLED, detail=reason or "killed", code=ErrorCode.CANCELLED
    )


def aborted(signal: CancelSignal) -> TaskOutcome:
    """The outcome of an activation stopped by its signal: ``killed``, unless the control
    plane aborted it for an internal failure (then ``failed``, detail naming the cause) or
    because its runtime lost the child's claim (then ``interrupted``)."""
    if signal.cause is ErrorCode.INTERNAL:
        return failed(signal.reason or "internal error", ErrorCode.INTERNAL)
    if signal.cause is ErrorCode.FENCED:
        return TaskOutcome(
            status=TaskStatus.INTERRUPTED,
            detail=f"interrupted: {signal.reason or 'this runtime lost its claim on the child'}",
            code=ErrorCode.FENCED,
        )
    return killed(signal.reason)


def unrecorded(outcome: TaskOutcome, exc: SubagentControlError) -> TaskOutcome:
    """The outcome of a turn whose end the store could not take: ``interrupted`` (its
    ``turn/end``, with that status, is written once the store is back), never ``failed``:
    a store outage ends running Tasks interrupted, never more."""
    earlier = outcome.detail or outcome.status.value
    return TaskOutcome(
        status=TaskStatus.INTERRUPTED,
        detail=(
            f"interrupted: the turn ended ({earlier}) but the store could not record it "
            f"({exc.message}); send the child a message to continue it"
        ),
        code=ErrorCode.STORE_UNAVAILABLE,
    )


def error_text(exc: BaseException) -> str:
    """An exception in words, for a Task's detail."""
    if isinstance(exc, SubagentControlError):
        return exc.message
    return str(exc) or type(exc).__name__


def not_delivered(child_id: str, task_id: str | None, why: str) -> SubagentControlError:
    """The refusal of a message its child's supervisor could not deliver (``why`` says
    what stood in the way): the sender may retry."""
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id}: {why}; the message was not delivered; retry after it settles",
        child_id=child_id,
        task_id=task_id,
    )
