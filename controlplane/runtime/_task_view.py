"""`Tasks`: what a parent holds as ``control.tasks`` — the documented verbs and nothing else.

The Task service (`controlplane.runtime.tasks._tasks.TaskService`) is also the book the actors, the
admission, the approvals and the heartbeat write through (settle, release, park, fence…).
Those members must not sit on the object a user holds, where a typo or a guess can settle
someone's Task: the facade keeps the service to itself and hands out this view, which
forwards each verb as it is.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from controlplane.contract import CancelSignal, Requester, TaskNotice, TaskSnapshot
    from controlplane.runtime.tasks._task_entry import TaskListener
    from controlplane.runtime.tasks._tasks import TaskService

__all__ = ["TASK_VERBS", "Tasks"]

TASK_VERBS: Final = ("drain_notices", "get", "kill", "list", "on_done", "output", "start", "wait")
"""The public names of `Tasks`, frozen by a test: adding one is a decision."""


class Tasks:
    """The Tasks of the control plane, fenced by owner session (``control.tasks``).

    ``get``, ``wait``, ``kill`` and ``output`` by anyone but the Task's owner raise
    ``TASK_NOT_FOUND`` exactly as for an unknown id; every verb answers for Tasks of any
    runtime on the store, after restarts.
    """

    __slots__ = ("_service",)

    def __init__(self, service: TaskService) -> None:
        self._service = service

    def get(self, task_id: str, *, requester: Requester) -> TaskSnapshot:
        """A snapshot of one of the requester's Tasks (a queued one with its place).

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND`` for an unknown id or another owner.
        """
        return self._service.get(task_id, requester=requester)

    def wait(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Block until the Task has settled and its activation is gone, or until it waits
        for an approval answer (``input_required``); return its snapshot. Once it returns
        for a settled Task, a follow-up message starts the child's next activation.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; ``TIMEOUT`` if it has not settled
                within ``timeout`` seconds (the Task keeps running).
        """
        return self._service.wait(task_id, timeout, requester=requester)

    def kill(self, task_id: str, *, requester: Requester) -> None:
        """Request the Task's cancellation and return at once; it reads ``killed`` once
        its run is disposed. Killing a settled Task changes nothing.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; for a Task running in another live
                runtime, ``OWNERSHIP_CONFLICT`` (SQLite) or ``NOT_DELIVERED`` (PostgreSQL,
                that runtime did not take the forwarded kill).
        """
        self._service.kill(task_id, requester=requester)

    def output(self, task_id: str, *, requester: Requester) -> str:
        """The Task's output: completed → its output; failed, killed, interrupted → its
        detail; still running → ``""``.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``.
        """
        return self._service.output(task_id, requester=requester)

    def list(self, requester: Requester) -> builtins.list[TaskSnapshot]:
        """The requester's Tasks, of every runtime, oldest first."""
        return self._service.list(requester)

    def on_done(self, listener: TaskListener) -> Callable[[], None]:
        """Call ``listener(snapshot)`` whenever a Task of this runtime settles; returns an
        unsubscribe function. Listeners run on the settling activation's thread, before
        the activation is gone: they must not block on that same Task."""
        return self._service.on_done(listener)

    def drain_notices(self, requester: Requester) -> builtins.list[TaskNotice]:
        """Take the requester's pending notices (one per settled Task, in any runtime, and
        any soft budget or approval notice), oldest first; each is taken once."""
        return self._service.drain_notices(requester)

    def start(
        self, *, label: str, owner: Requester, child_id: str | None, signal: CancelSignal
    ) -> TaskSnapshot:
        """Register a running background Task of kind ``subagent`` that ``signal`` cancels
        (a child's start does this itself; a harness running its own background work may
        too). Refused without a control surface to observe it through.

        Raises:
            SubagentControlError: ``NO_CONTROL_SURFACE`` without an attached surface
                (``SubagentControl(..., task_tools=False)``), ``CLOSED``, ``UNAUTHORIZED``
                for an owner no longer live, ``CAPACITY``, ``STORE_UNAVAILABLE``.
        """
        return self._service.start(label=label, owner=owner, child_id=child_id, signal=signal)

    def __repr__(self) -> str:
        return f"<Tasks {', '.join(TASK_VERBS)}>"
