"""The Task service: what parents observe of activations, fenced by owner session, and
the book the runtime writes them through (users hold the `controlplane.runtime._task_view.Tasks`
view of it, with the read verbs only).

`TaskService` is the read side (snapshots, ``wait``, ``kill``, notices, listeners) over the
book of live Tasks it extends (`controlplane.runtime.tasks._task_book.TaskBook`, which the actors
write through), and over the store's Task rows for the Tasks this runtime does not hold."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from controlplane.contract import (
    ApprovalRequest,
    ErrorCode,
    SubagentControlError,
    TaskNotice,
    TaskSnapshot,
    TaskStatus,
    requester_session,
)
from controlplane.runtime.tasks._task_book import TaskBook
from controlplane.runtime.tasks._task_entry import (
    Claimer,
    Interrupter,
    TaskLedgerPort,
    TaskListener,
    TaskRouting,
    notice_of,
)

if TYPE_CHECKING:
    from controlplane.runtime.tasks._task_entry import (
        Requester,
        TaskEntry,
    )

__all__ = [
    "Claimer",
    "Interrupter",
    "TaskLedgerPort",
    "TaskListener",
    "TaskNotice",
    "TaskRouting",
    "TaskService",
]

NoticeSource = Callable[[str], list[tuple[datetime, TaskNotice]]]
"""Where other notices for an owner come from: ``source(owner)`` takes them."""
RequestSource = Callable[[list[str]], dict[str, ApprovalRequest]]
"""The open approval request of each of these Tasks that has one."""
ParkedKiller = Callable[[TaskSnapshot, str], bool]
"""Kill a Task parked on an approval request; False if it is not parked (it runs)."""

_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.5


class TaskService(TaskBook):
    """Registers, settles and exposes Tasks. Thread-safe.

    Access is fenced by owner session: ``get``, ``wait``, ``kill`` and ``output`` by anyone
    but the owner raise ``TASK_NOT_FOUND`` exactly as for an unknown id.

    With a ledger (the store's), every Task is kept there: written when admitted and when
    settled, read back for Tasks this runtime does not hold (other runtimes', earlier
    processes'), and completion notices are drained from it, once across every runtime.
    The constructor's arguments are the book's (`TaskBook`).
    """

    _notice_sources: list[NoticeSource]
    _requests: RequestSource | None
    _kill_parked: ParkedKiller | None

    def __init__(self, **book: Any) -> None:
        super().__init__(**book)
        self._notice_sources = []
        self._requests = None
        self._kill_parked = None

    def add_approvals(self, requests: RequestSource, kill_parked: ParkedKiller) -> None:
        """Read waiting Tasks' requests from ``requests``, and kill a Task
        parked on one through ``kill_parked`` (it has no activation anywhere)."""
        self._requests = requests
        self._kill_parked = kill_parked

    # -- waiting (the runtime's close: unfenced) -------------------------------------

    def wait_released(self, task_id: str, timeout: float | None) -> bool:
        """Wait (unfenced) until a Task of this runtime is released; returns whether it was."""
        task = self._live.get(task_id)
        return True if task is None else task.released.wait(timeout)

    # -- owner side (public) ---------------------------------------------------------

    def get(self, task_id: str, *, requester: Requester) -> TaskSnapshot:
        """A snapshot of one of the requester's Tasks, from any runtime (a queued one with
        its queue position).

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND`` for an unknown id or another owner.
        """
        return self._placed([self._spent_elsewhere(self._fenced(task_id, requester))])[0]

    def wait(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Block until the Task has settled and its activation is gone, or until it waits
        for the answer to an approval request (``input_required``); return its
        snapshot.

        A Task of another runtime is polled in the store (with backoff) until it settles
        there (or waits for an answer), or until its runtime is found dead and it is
        settled ``interrupted``.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; ``TIMEOUT`` if it has not settled
                within ``timeout`` seconds (the Task keeps running).
        """
        snapshot = self._fenced(task_id, requester)
        deadline = None if timeout is None else time.monotonic() + timeout
        live = self._live.get(snapshot.id)
        elsewhere = live is None
        if live is not None:
            while live.resting.wait(None if deadline is None else deadline - time.monotonic()):
                snapshot = self.get(task_id, requester=requester)
                if snapshot.status.is_resting:
                    return snapshot
                if live.parked:
                    # Gone from this runtime, going on in another one (left for a runtime
                    # with its provider, or handed over on close): wait on in the store.
                    elsewhere = True
                    break
                if live.resting.is_set():
                    return snapshot
                # Its answer was taken as this waiter woke: it runs again, so wait on.
        if elsewhere and snapshot.status.is_resting:
            return self.get(task_id, requester=requester)
        if elsewhere:
            pause = _POLL_FIRST_S
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, _POLL_MAX_S)
                snapshot = self._fenced(task_id, requester)
                if snapshot.status.is_resting:
                    return self.get(task_id, requester=requester)
        raise SubagentControlError(
            ErrorCode.TIMEOUT,
            f"task {task_id} is still {snapshot.status.value} after {timeout}s; wait again",
            task_id=task_id,
        )

    def kill(self, task_id: str, *, requester: Requester) -> None:
        """Request the Task's cancellation and return at once (settlement follows).

        Killing a settled Task changes nothing.

        Raises:
            SubagentControlError: as `_kill`.
        """
        with self.telemetry.kill(task_id):  # a span; a forwarded kill carries its context
            self._kill(task_id, requester=requester)

    def _kill(self, task_id: str, *, requester: Requester) -> None:
        """Request the Task's cancellation and return at once (settlement follows).

        Killing a settled Task changes nothing.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; for a Task that runs in another
                live runtime, ``OWNERSHIP_CONFLICT`` on SQLite, and on PostgreSQL (which
                forwards the kill there) ``NOT_DELIVERED`` if that runtime did not take it.
        """
        snapshot = self._fenced(task_id, requester)
        if snapshot.status.is_terminal:
            return
        reason = f"killed by {requester_session(requester)}"
        live = self._live.get(snapshot.id)
        if live is not None:
            self._abort(live, reason)
            # Killed, it waits for no answer: a `wait` from now on waits for the outcome.
            self.asking(live.id, None)
            if live.parked and self._kill_parked is not None:
                self._kill_parked(snapshot, reason)  # it parked as it was aborted
        elif (
            # Parked on an approval request, or left for a runtime with its provider:
            # no activation anywhere, its claim kept with no runtime.
            (snapshot.status is TaskStatus.INPUT_REQUIRED or snapshot.waiting_for is not None)
            and self._kill_parked is not None
            and self._kill_parked(snapshot, reason)
        ):
            return  # parked: settled killed in the store, its turn closed
        elif self._routing is not None:
            self._routing.kill_elsewhere(snapshot, reason)

    def output(self, task_id: str, *, requester: Requester) -> str:
        """The Task's output: completed → output; failed, killed, interrupted → detail;
        running → ``""``.

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
        """Call ``listener(snapshot)`` whenever a Task of this runtime settles; returns an
        unsubscribe function.

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

    def park(self, task_id: str) -> TaskEntry | None:
        """`TaskBook.park`; a Task killed as its run parked is settled ``killed`` in the
        store (its kill found it live here a moment before)."""
        task = super().park(task_id)
        signal = task.signal if task is not None else None
        if (
            task is not None
            and signal is not None
            and signal.aborted
            and signal.cause is None  # a kill (closing parks on purpose)
            and self._kill_parked is not None
        ):
            self._kill_parked(task.snapshot(), signal.reason or "killed")
        return task

    def on_rest(self, listener: TaskListener) -> Callable[[], None]:
        """Call ``listener(snapshot)`` whenever a Task of this runtime starts waiting for
        an approval answer (``input_required``); returns an unsubscribe function."""
        with self._lock:
            self._rest_listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._rest_listeners:
                    self._rest_listeners.remove(listener)

        return unsubscribe

    def add_notices(self, source: NoticeSource) -> None:
        """Drain ``source``'s notices with the completion notices from now on (the soft
        budget notices): ``source(owner)`` takes the owner's, each once, with
        the time each was written."""
        self._notice_sources.append(source)

    def drain_notices(self, requester: Requester) -> list[TaskNotice]:
        """Take the requester's pending completion notices (one per settled Task, in any
        runtime, ``interrupted`` ones included), and any soft budget notice of a running
        one, oldest first. Each is taken once."""
        owner = requester_session(requester)
        if self._ledger is not None:
            timed = [
                (snapshot.settled_at or snapshot.created_at, notice_of(snapshot))
                for snapshot in self._ledger.drain(owner)
            ]
            for source in self._notice_sources:
                timed += source(owner)
            timed.sort(key=lambda pair: pair[0])
            return [notice for _at, notice in timed]
        with self._lock:
            pending = self._notices.pop(owner, None)
        return list(pending or ())

    def list(self, requester: Requester) -> list[TaskSnapshot]:
        """The requester's Tasks (of every runtime), oldest first."""
        owner = requester_session(requester)
        with self._lock:
            mine = {t.id: t.snapshot() for t in self._live.values() if t.owner == owner}
        if self._ledger is None:
            return sorted(mine.values(), key=lambda t: t.created_at)
        # The store has every Task; this runtime's own view wins for the ones it holds
        # (a settlement the store has not taken yet).
        return self._placed(
            [mine.get(t.id) or self._spent_elsewhere(t) for t in self._ledger.owned_by(owner)]
        )

    def _spent_elsewhere(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        """A Task running in another runtime (or left running by a dead one) with what its
        turn has written so far, read from its child's open rows: its row keeps its spend
        only once it settles."""
        if (
            self._ledger is None
            or snapshot.status is not TaskStatus.RUNNING
            or snapshot.id in self._live
        ):
            return snapshot
        return snapshot.model_copy(update={"usage": self._ledger.running_spend(snapshot)})

    def live(self, task_ids: builtins.list[str]) -> builtins.list[TaskSnapshot]:
        """The snapshots of those of these Tasks whose activations exist here (unfenced:
        for the tree dump), queued ones with their queue positions."""
        found = [t.snapshot() for t in (self._live.get(i) for i in task_ids) if t is not None]
        return self._placed(found)

    def _placed(self, snapshots: builtins.list[TaskSnapshot]) -> builtins.list[TaskSnapshot]:
        """Queued Tasks with their queue positions, and Tasks waiting for an answer with
        their requests (a read only when one is queued, or waits without its request)."""
        if self._queue is not None and any(s.status is TaskStatus.QUEUED for s in snapshots):
            snapshots = self._queue.with_places(snapshots)
        asking = [
            s.id for s in snapshots if s.status is TaskStatus.INPUT_REQUIRED and s.request is None
        ]
        if not asking or self._requests is None:
            return snapshots
        found = self._requests(asking)
        return [
            s.model_copy(update={"request": found[s.id]}) if s.id in found else s for s in snapshots
        ]

    def _fenced(self, task_id: object, requester: Requester) -> TaskSnapshot:
        owner = requester_session(requester)
        found: TaskSnapshot | None = None
        if isinstance(task_id, str):
            live = self._live.get(task_id)
            if live is not None:
                found = live.snapshot()
            else:
                found = self._recent.get(task_id)
                if found is None and self._ledger is not None:
                    found = self._ledger.get(task_id) if _plausible_id(task_id) else None
        if found is None or found.owner_session != owner:
            raise SubagentControlError(
                ErrorCode.TASK_NOT_FOUND,
                f"no task {task_id!r} for this session; list your tasks and use one of those ids",
                task_id=task_id if isinstance(task_id, str) else None,
            )
        return found


def _plausible_id(task_id: str) -> bool:
    """Whether a store lookup can find ``task_id`` (ids are uuid4 strings): anything else
    is unknown without asking the store (which may not even encode it)."""
    return 0 < len(task_id) <= 64 and task_id.isascii() and "\x00" not in task_id
