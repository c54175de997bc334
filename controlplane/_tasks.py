"""The Task service: what parents observe of activations, fenced by owner session."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from controlplane._agents import AgentHandle
from controlplane._errors import ErrorCode, SubagentControlError
from controlplane._session import utcnow
from controlplane._signal import CancelSignal
from controlplane._task_types import TaskOutcome, TaskSnapshot, TaskStatus

__all__ = ["TaskListener", "TaskNotice", "TaskService"]

log = logging.getLogger(__name__)

TaskListener = Callable[[TaskSnapshot], object]
Requester = AgentHandle | str

_VERBS = {
    TaskStatus.COMPLETED: "finished",
    TaskStatus.KILLED: "stopped",
    TaskStatus.FAILED: "failed",
}
_SUMMARY_LIMIT = 500


class TaskNotice(BaseModel):
    """A one-line completion notice for a Task's owner, to put in front of the parent model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    child_id: str | None
    label: str
    status: TaskStatus
    summary: str


@dataclass(eq=False)
class _Task:
    id: str
    label: str
    owner: str
    child_id: str | None
    signal: CancelSignal
    created_at: datetime = field(default_factory=utcnow)
    outcome: TaskOutcome | None = None
    ended_at: datetime | None = None
    # Set only once the activation is gone from its supervisor, so `wait()` returning means
    # a follow-up starts the next activation.
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def status(self) -> TaskStatus:
        return TaskStatus.RUNNING if self.outcome is None else self.outcome.status

    def snapshot(self) -> TaskSnapshot:
        return TaskSnapshot(
            id=self.id,
            label=self.label,
            owner_session=self.owner,
            status=self.status,
            outcome=self.outcome,
            child_id=self.child_id,
            created_at=self.created_at,
            ended_at=self.ended_at,
        )


class TaskService:
    """Registers, settles and exposes Tasks. Thread-safe.

    Access is fenced by owner session: ``get``, ``wait``, ``kill`` and ``output`` by anyone
    but the owner raise ``TASK_NOT_FOUND`` exactly as for an unknown id.
    """

    def __init__(self, *, max_live: int | None = None) -> None:
        self._lock = threading.Lock()
        self._max_live = max_live
        self._live = 0  # Tasks started and not yet released: activations that exist
        self._tasks: dict[str, _Task] = {}
        self._latest_by_child: dict[str, str] = {}
        self._listeners: list[TaskListener] = []
        self._notices: dict[str, deque[TaskNotice]] = {}
        self._surfaces: set[str] = set()
        self._closed_reason: str | None = None

    # -- control surface -------------------------------------------------------------

    def attach_surface(self, name: str) -> None:
        """Attach a control surface (e.g. the built-in task tools) through which owners
        observe and kill background Tasks; without one, `start` refuses."""
        with self._lock:
            self._surfaces.add(name)

    @property
    def has_surface(self) -> bool:
        """Whether a control surface is attached."""
        return bool(self._surfaces)

    def require_surface(self) -> None:
        """Raise ``NO_CONTROL_SURFACE`` unless a control surface is attached."""
        if not self._surfaces:
            raise SubagentControlError(
                ErrorCode.NO_CONTROL_SURFACE,
                "no task control surface is attached, so a background Task could not be "
                "observed or killed; attach one (the default task tools) and retry",
            )

    # -- producer side (the control plane) -------------------------------------------

    def start(
        self, *, label: str, owner: Requester, child_id: str | None, signal: CancelSignal
    ) -> TaskSnapshot:
        """Register a running Task of kind ``subagent``.

        Raises:
            SubagentControlError: ``NO_CONTROL_SURFACE`` without an attached surface,
                ``CLOSED`` once `close` was called, ``UNAUTHORIZED`` when the owner's
                `AgentHandle` is no longer live.
        """
        task = _Task(
            id=str(uuid.uuid4()),
            label=label,
            owner=_session_of(owner),
            child_id=child_id,
            signal=signal,
        )
        with self._lock:
            # Checked under the lock that `kill_owned_by` scans with: an owner disposed
            # concurrently either sees this Task and kills it, or is seen dead here.
            if isinstance(owner, AgentHandle) and not owner.is_live:
                raise SubagentControlError(
                    ErrorCode.UNAUTHORIZED,
                    f"owner session {owner.session_id!r} was disposed; nothing was started",
                )
            if self._closed_reason is not None:
                raise SubagentControlError(
                    ErrorCode.CLOSED, "the control plane is closed; nothing was started"
                )
            self.require_surface()
            if self._max_live is not None and self._live >= self._max_live:
                raise SubagentControlError(
                    ErrorCode.CAPACITY,
                    f"{self._live} activations are live, the cap (max_live_activations="
                    f"{self._max_live}); nothing was started; retry once some have settled",
                    child_id=child_id,
                )
            self._live += 1
            self._tasks[task.id] = task
            if child_id is not None:
                self._latest_by_child[child_id] = task.id
        return task.snapshot()

    def discard(self, task_id: str) -> None:
        """Forget a Task that never ran (its start was refused after registration)."""
        with self._lock:
            task = self._tasks.pop(task_id, None)
            if task is not None and self._latest_by_child.get(task.child_id or "") == task_id:
                del self._latest_by_child[task.child_id or ""]
            if task is not None:
                self._release(task)

    def settle(self, task_id: str, outcome: TaskOutcome) -> TaskSnapshot:
        """Record a terminal outcome, queue the owner's notice and run the listeners.

        The Task is not released yet: `wait` returns only after `release`.
        """
        with self._lock:
            task = self._tasks[task_id]
            if task.outcome is not None:
                return task.snapshot()
            task.outcome = outcome
            task.ended_at = utcnow()
            snapshot = task.snapshot()
            self._notices.setdefault(task.owner, deque()).append(_notice(snapshot))
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(snapshot)
            except BaseException:  # escaping, it would stop every actor
                log.exception("on_done listener %r failed for task %s", listener, task_id)
        return snapshot

    def release(self, task_id: str) -> None:
        """Mark a settled Task's activation as gone; `wait` returns from here on."""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None:
                self._release(task)

    def _release(self, task: _Task) -> None:
        """Under the lock: the Task's activation is gone (once)."""
        if not task.released.is_set():
            self._live -= 1
            task.released.set()

    def status_of(self, task_id: str) -> TaskStatus | None:
        """The status of any Task (unfenced; for the control plane itself)."""
        task = self._tasks.get(task_id)
        return None if task is None else task.status

    def owner_of(self, task_id: str) -> str | None:
        """The owner session of any Task (unfenced; for the control plane itself)."""
        task = self._tasks.get(task_id)
        return None if task is None else task.owner

    def latest_for_child(self, child_id: str) -> TaskSnapshot | None:
        """The newest Task of a child in this process, if any (unfenced)."""
        with self._lock:
            task_id = self._latest_by_child.get(child_id)
            task = None if task_id is None else self._tasks.get(task_id)
            return None if task is None else task.snapshot()

    def kill_owned_by(self, owner: str, reason: str) -> int:
        """Abort every running Task owned by ``owner``; returns how many were aborted."""
        with self._lock:
            running = [t for t in self._tasks.values() if t.owner == owner and t.outcome is None]
        return sum(task.signal.abort(reason) for task in running)

    def close(self, reason: str) -> list[str]:
        """Refuse new Tasks and abort every running one; returns the ids not yet released."""
        with self._lock:
            self._closed_reason = reason
            tasks = list(self._tasks.values())
        for task in tasks:
            if task.outcome is None:
                task.signal.abort(reason)
        return [task.id for task in tasks if not task.released.is_set()]

    def abandon(self, detail: str) -> int:
        """Settle every Task still running ``killed`` with ``detail``, and release every
        Task: `close` gave up waiting for their activations, and no caller may see a
        Task ``running`` after it. Returns how many were still running."""
        with self._lock:
            unreleased = [t for t in self._tasks.values() if not t.released.is_set()]
        running = 0
        for task in unreleased:
            if task.outcome is None:
                running += 1
                self.settle(
                    task.id,
                    TaskOutcome(status=TaskStatus.KILLED, detail=detail, code=ErrorCode.CLOSED),
                )
        with self._lock:
            for task in unreleased:
                self._release(task)
        return running

    def wait_released(self, task_id: str, timeout: float | None) -> bool:
        """Wait (unfenced) until a Task is released; returns whether it was."""
        task = self._tasks.get(task_id)
        return True if task is None else task.released.wait(timeout)

    # -- owner side (public) ---------------------------------------------------------

    def get(self, task_id: str, *, requester: Requester) -> TaskSnapshot:
        """A snapshot of one of the requester's Tasks.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND`` for an unknown id or another owner.
        """
        return self._fenced(task_id, requester).snapshot()

    def wait(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Block until the Task has settled and its activation is gone; return its snapshot.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; ``TIMEOUT`` if it has not settled
                within ``timeout`` seconds (the Task keeps running).
        """
        task = self._fenced(task_id, requester)
        if not task.released.wait(timeout):
            raise SubagentControlError(
                ErrorCode.TIMEOUT,
                f"task {task_id} is still {task.status.value} after {timeout}s; wait again",
                task_id=task_id,
            )
        return task.snapshot()

    def kill(self, task_id: str, *, requester: Requester) -> None:
        """Request the Task's cancellation and return at once (settlement follows).

        Killing a settled Task changes nothing.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``.
        """
        task = self._fenced(task_id, requester)
        if task.outcome is None:
            task.signal.abort(f"killed by {_session_of(requester)}")

    def output(self, task_id: str, *, requester: Requester) -> str:
        """The Task's output: completed → output; failed or killed → detail; running → ``""``.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``.
        """
        outcome = self._fenced(task_id, requester).outcome
        if outcome is None:
            return ""
        if outcome.status is TaskStatus.COMPLETED:
            return outcome.output or ""
        return outcome.detail or ""

    def on_done(self, listener: TaskListener) -> Callable[[], None]:
        """Call ``listener(snapshot)`` whenever a Task settles; returns an unsubscribe function.

        Listeners run on the settling activation's thread, before the activation is removed
        from its supervisor; they must not block on that same Task.
        """
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def drain_notices(self, requester: Requester) -> list[TaskNotice]:
        """Take the requester's pending completion notices (one per settled Task), oldest first."""
        owner = _session_of(requester)
        with self._lock:
            pending = self._notices.pop(owner, None)
        return list(pending or ())

    def list(self, requester: Requester) -> list[TaskSnapshot]:
        """The requester's Tasks, oldest first."""
        owner = _session_of(requester)
        with self._lock:
            return [t.snapshot() for t in self._tasks.values() if t.owner == owner]

    def _fenced(self, task_id: object, requester: Requester) -> _Task:
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None or task.owner != _session_of(requester):
            raise SubagentControlError(
                ErrorCode.TASK_NOT_FOUND,
                f"no task {task_id!r} for this session; list your tasks and use one of those ids",
                task_id=task_id if isinstance(task_id, str) else None,
            )
        return task


def _session_of(requester: Requester) -> str:
    if isinstance(requester, AgentHandle):
        return requester.session_id
    if isinstance(requester, str):
        return requester
    raise SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"requester must be an AgentHandle or a session id, not {type(requester).__name__}",
    )


def _notice(snapshot: TaskSnapshot) -> TaskNotice:
    outcome = snapshot.outcome
    assert outcome is not None
    text = outcome.output if outcome.status is TaskStatus.COMPLETED else outcome.detail
    body = " ".join((text or "").split())
    if len(body) > _SUMMARY_LIMIT:
        body = body[: _SUMMARY_LIMIT - 1] + "…"
    summary = f"subagent task {snapshot.id} ({snapshot.label}) {_VERBS[outcome.status]}"
    return TaskNotice(
        task_id=snapshot.id,
        child_id=snapshot.child_id,
        label=snapshot.label,
        status=outcome.status,
        summary=f"{summary}: {body}" if body else summary,
    )
