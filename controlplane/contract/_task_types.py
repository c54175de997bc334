"""What a parent observes of a Task."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.contract._approval import ApprovalRequest
from controlplane.contract._errors import ErrorCode
from controlplane.contract._usage import Usage

__all__ = ["RuntimeInfo", "TaskNotice", "TaskOutcome", "TaskSnapshot", "TaskStatus"]


class TaskStatus(StrEnum):
    """A Task's status; every value but ``running``, ``queued`` and ``input_required`` is
    terminal.

    ``queued``: admitted, waiting for a slot under a concurrency limit; it
    reads ``running`` once a slot frees (FIFO, in whichever runtime holds it).
    ``input_required``: its child waits for the answer to an approval request
    (`TaskSnapshot.request`); it reads ``running`` again once the answer is taken.
    ``interrupted``: the Task's runtime ended (crash, kill, lost claim) before it settled;
    a live runtime settled it so. Send the child a message to continue it.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"
    INTERRUPTED = "interrupted"
    QUEUED = "queued"
    INPUT_REQUIRED = "input_required"

    @property
    def is_terminal(self) -> bool:
        """Whether the Task has settled."""
        return self not in _LIVE

    @property
    def is_resting(self) -> bool:
        """Whether ``tasks.wait`` returns on it: settled, or waiting for an answer."""
        return self is TaskStatus.INPUT_REQUIRED or self.is_terminal


_LIVE = frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.INPUT_REQUIRED})


class TaskOutcome(BaseModel):
    """How a Task ended: ``output`` for completed, ``detail`` for failed (and killed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: TaskStatus
    output: str | None = None
    detail: str | None = None
    code: ErrorCode | None = None


class TaskSnapshot(BaseModel):
    """A point-in-time view of a Task, as kept in the store.

    Attributes:
        runtime_id: The runtime (`SubagentControl.runtime_id`) that ran it.
        settled_at: When it settled (None while running); ``ended_at`` is the same time,
            under its older name.
        usage: What its activation spent: while it runs, what its turn has
            written so far; once settled, what its turn spent, kept with the Task.
        queue_position: While ``queued``: its place in the queue of its concurrency key
            (1 = next to start; the largest over its keys); None otherwise.
        queued_at: When it entered the queue of a concurrency key, if it did (kept while
            its activation holds the slot); ``admitted_at`` when it got the slot. The
            wait is the difference (or now minus ``queued_at`` while queued).
        request: While ``input_required``: the approval request its child waits on
            (``id``, ``tool``, ``arguments``; answer it with `SubagentControl.answer`).
        recoveries: How many times another runtime carried its turn on after the
            runtime running it ended.
        waiting_for: While ``queued`` for a runtime that has its child's provider (the
            runtime that took its message lacks it): that provider's name; None otherwise.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    kind: Literal["subagent"] = "subagent"
    label: str
    owner_session: str
    status: TaskStatus
    outcome: TaskOutcome | None = None
    child_id: str | None = None
    runtime_id: str | None = None
    created_at: datetime
    settled_at: datetime | None = None
    ended_at: datetime | None = None
    usage: Usage = Field(default_factory=Usage.zero)
    queue_position: int | None = None
    queued_at: datetime | None = None
    admitted_at: datetime | None = None
    request: ApprovalRequest | None = None
    recoveries: int = 0
    waiting_for: str | None = None


class TaskNotice(BaseModel):
    """A one-line completion notice for a Task's owner, to put in front of the parent model
    (`tasks.drain_notices`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    child_id: str | None
    label: str
    status: TaskStatus
    summary: str


class RuntimeInfo(BaseModel):
    """One runtime (an open `SubagentControl`) as the store knows it.

    A runtime is dead once it closed, or once its heartbeat is older than its
    ``lease_ttl_s``; its running Tasks are then settled ``interrupted`` by a live one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime_id: str
    host: str
    pid: int
    boot_id: str | None = None
    started_at: datetime
    heartbeat_at: datetime
    lease_ttl_s: float
    closed_at: datetime | None = None
    heartbeat_boot_s: float | None = None
    """SQLite: the host's boot clock (``CLOCK_BOOTTIME``, seconds) at the last heartbeat,
    under ``boot_id``; its lease is judged on it, not on ``heartbeat_at``'s wall clock."""
    running_tasks: int = 0
