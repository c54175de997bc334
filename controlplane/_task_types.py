"""What a parent observes of a Task."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from controlplane._errors import ErrorCode

__all__ = ["TaskOutcome", "TaskSnapshot", "TaskStatus"]


class TaskStatus(StrEnum):
    """A Task's status; every value but ``running`` is terminal."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"

    @property
    def is_terminal(self) -> bool:
        """Whether the Task has settled."""
        return self is not TaskStatus.RUNNING


class TaskOutcome(BaseModel):
    """How a Task ended: ``output`` for completed, ``detail`` for failed (and killed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: TaskStatus
    output: str | None = None
    detail: str | None = None
    code: ErrorCode | None = None


class TaskSnapshot(BaseModel):
    """A point-in-time view of a Task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    kind: Literal["subagent"] = "subagent"
    label: str
    owner_session: str
    status: TaskStatus
    outcome: TaskOutcome | None = None
    child_id: str | None = None
    created_at: datetime
    ended_at: datetime | None = None
