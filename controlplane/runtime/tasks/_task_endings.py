"""How the Tasks in the book of live Tasks (`controlplane.runtime.tasks._task_book.TaskBook`)
end: fenced by the lease watchdog, killed, closed with the runtime, settled and released.
A settlement is written to the store (kept for `TaskEndings.flush` when the store refuses it
or the runtime is fenced), and what the store says is adopted when another runtime settled
or took the Task first. Apart from the book's admissions because ending is the part that
must go on while the store is away; it reads the book's state only under the book's lock.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from datetime import datetime
from typing import TYPE_CHECKING

from controlplane.contract import (
    ErrorCode,
    SubagentControlError,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from controlplane.runtime.tasks._task_entry import TaskEntry, notice_of
from controlplane.telemetry import log_kill, log_settled

if TYPE_CHECKING:
    from controlplane.contract import TaskNotice
    from controlplane.runtime.tasks._task_entry import Interrupter, TaskLedgerPort, TaskListener

__all__ = ["TaskEndings"]

log = logging.getLogger(__name__)


class TaskEndings:
    """The ending half of `TaskBook`, which holds the state named here (set in its
    ``__init__``) and guards it with ``_lock``."""

    _lock: threading.Lock
    _ledger: TaskLedgerPort | None
    _runtime_id: str | None
    _live: dict[str, TaskEntry]
    _recent: OrderedDict[str, TaskSnapshot]
    _recent_cap: int
    _unsaved: dict[str, tuple[str, TaskOutcome, datetime]]
    _unsaved_fenced: dict[str, TaskSnapshot]
    _interrupter: Interrupter | None
    _suspended: str | None
    _closed_reason: str | None
    _listeners: list[TaskListener]
    _notices: dict[str, deque[TaskNotice]]

    # -- fencing (the runtime's lease watchdog) ------------------------------

    def fence(self, reason: str) -> int:
        """Stop acting: abort every running Task (cause ``FENCED``: they settle
        ``interrupted`` with ``reason``) and refuse new ones until `readmit`. Takes no
        store call: the watchdog calls it when the store may be unreachable. Returns how
        many were aborted."""
        with self._lock:
            self._suspended = reason
            running = [t for t in self._live.values() if t.outcome is None]
        aborted = 0
        for task in running:
            if task.signal.abort(reason, cause=ErrorCode.FENCED):
                aborted += 1
                log_kill(task.child_id, task.id, self._runtime_id, reason)
        return aborted

    @property
    def suspended(self) -> str | None:
        """Why new Tasks are refused (the last `fence`'s reason), or None."""
        return self._suspended

    def readmit(self, fenced: str) -> None:
        """Accept new Tasks again (the runtime renewed its lease and wrote its fenced
        Tasks' settlements), unless a later `fence` than the one read as ``fenced``
        happened meanwhile."""
        with self._lock:
            if self._suspended is fenced:
                self._suspended = None

    def settle(
        self,
        task_id: str,
        outcome: TaskOutcome,
        *,
        at: datetime | None = None,
        persisted: bool = False,
    ) -> TaskSnapshot:
        """Record a terminal outcome, write it to the store (unless ``persisted``: written
        already, with the turn's end), queue the owner's notice and run the listeners.

        A store that refuses the write keeps the settlement for `flush` to retry. The Task
        is not released yet: `wait` returns only after `release`.
        """
        settled_at = at or utcnow()
        with self._lock:
            task = self._live[task_id]
            if task.outcome is not None:
                return task.snapshot()
            snapshot = task.settle_as(outcome, settled_at)
            if self._ledger is None:
                self._notices.setdefault(task.owner, deque()).append(notice_of(snapshot))
            listeners = list(self._listeners)
        log_settled(snapshot, self._runtime_id)
        if self._ledger is not None and not persisted:
            if outcome.code is ErrorCode.FENCED and self._interrupter is not None:
                with self._lock:
                    self._unsaved_fenced[task_id] = snapshot
            elif self._suspended is not None:
                # Fenced (a Task killed before the fence came): the store may be cut off,
                # and this thread is the activation's, which must stop within the quarter
                # lease; the write waits for `flush`, once the runtime renews.
                with self._lock:
                    self._unsaved[task_id] = (task_id, outcome, settled_at)
            else:
                self._save((task_id, outcome, settled_at))
        for listener in listeners:
            try:
                listener(snapshot)
            except BaseException:  # escaping, it would stop every actor
                log.exception("on_done listener %r failed for task %s", listener, task_id)
        return snapshot

    def _save(self, settlement: tuple[str, TaskOutcome, datetime]) -> None:
        """Write a settlement that no ``turn/end`` carried (the store closes the Task's
        open turn with it); one the store refuses is kept for `flush`, the child's claim
        still held meanwhile, so no later turn of it begins before this one's end."""
        assert self._ledger is not None
        try:
            written = self._ledger.settle(settlement)
        except SubagentControlError as exc:
            log.warning("could not record the settlement of task %s (%s); will retry",
                        settlement[0], exc.message)  # fmt: skip
            with self._lock:
                self._unsaved[settlement[0]] = settlement
            return
        if not written:
            self._adopt(settlement[0])

    def _adopt(self, task_id: str) -> None:
        """The store settled the Task first (another runtime's sweep or takeover, or our
        own earlier write whose acknowledgement was lost): this runtime answers what the
        store says from now on."""
        assert self._ledger is not None
        try:
            stored = self._ledger.get(task_id)
        except SubagentControlError:
            return
        if stored is None or stored.outcome is None:
            return
        with self._lock:
            task = self._live.get(task_id)
            if task is not None:
                task.settle_as(stored.outcome, stored.settled_at, stored.usage)
            elif task_id in self._recent:
                self._recent[task_id] = stored

    def _follow_store(self, task_id: str) -> None:
        """A fenced Task's settlement was not written because the store moved on without
        this runtime: another runtime settled it (its answer is adopted), or recovered it
        and runs it (this runtime's ``interrupted`` is forgotten, once its activation is
        gone, so its reads go to the store, which follows that runtime)."""
        assert self._ledger is not None
        try:
            stored = self._ledger.get(task_id)
        except SubagentControlError:
            return
        if stored is None:
            return
        if stored.outcome is not None:
            self._adopt(task_id)
            return
        if stored.runtime_id == self._runtime_id:
            return  # still this runtime's in the store: its answer stands
        with self._lock:
            task = self._live.get(task_id)
            if task is not None and task.released.is_set():
                del self._live[task_id]
            self._recent.pop(task_id, None)

    def flush(self, child_id: str | None = None) -> int:
        """Retry the settlements the store refused, and write the fenced Tasks' (with
        their turns' ends); only those of ``child_id``'s Tasks, when given. Returns how
        many are still unsaved."""
        with self._lock:
            pending = [
                settlement
                for task_id, settlement in self._unsaved.items()
                if child_id is None or self._child_of(task_id) == child_id
            ]
            for settlement in pending:
                del self._unsaved[settlement[0]]
            fenced = [
                snapshot
                for snapshot in self._unsaved_fenced.values()
                if child_id is None or snapshot.child_id == child_id
            ]
        for settlement in pending:
            self._save(settlement)
        for snapshot in fenced:
            assert self._interrupter is not None
            try:
                written = self._interrupter(snapshot)
            except SubagentControlError as exc:
                log.warning("could not record the interruption of task %s (%s); will retry",
                            snapshot.id, exc.message)  # fmt: skip
                continue
            with self._lock:
                self._unsaved_fenced.pop(snapshot.id, None)
            if not written:  # settled, or carried on, by another runtime: the store says
                self._follow_store(snapshot.id)
        with self._lock:
            return len(self._unsaved) + len(self._unsaved_fenced)

    def _child_of(self, task_id: str) -> str | None:
        """Under the lock: the child of a Task this runtime still remembers."""
        task = self._live.get(task_id)
        if task is not None:
            return task.child_id
        recent = self._recent.get(task_id)
        return None if recent is None else recent.child_id

    def release(self, task_id: str) -> None:
        """Mark a settled Task's activation as gone; `wait` returns from here on."""
        with self._lock:
            task = self._live.get(task_id)
            if task is None:
                return
            if task.outcome is not None:
                del self._live[task_id]
                self._remember(task.snapshot())
        task.released.set()
        task.resting.set()

    def _remember(self, snapshot: TaskSnapshot) -> None:
        """Under the lock: keep a settled Task among the recent ones (bounded)."""
        self._recent[snapshot.id] = snapshot
        while len(self._recent) > self._recent_cap:
            self._recent.popitem(last=False)

    def kill_here(self, task_id: str, reason: str) -> bool:
        """Abort a Task running in this runtime (a kill another runtime forwarded here,
        its requester already fenced there); False if it does not run here."""
        task = self._live.get(task_id)
        if task is None or task.view.outcome is not None:
            return False
        self._abort(task, reason)
        return True

    def kill_owned_by(self, owner: str, reason: str) -> int:
        """Abort every running Task owned by ``owner``; returns how many were aborted."""
        with self._lock:
            running = [t for t in self._live.values() if t.owner == owner and t.outcome is None]
        return sum(self._abort(task, reason) for task in running)

    def _abort(self, task: TaskEntry, reason: str, *, cause: ErrorCode | None = None) -> bool:
        """Abort a Task's signal: the first abort is its kill (logged)."""
        first = task.signal.abort(reason, cause=cause)
        if first:
            log_kill(task.child_id, task.id, self._runtime_id, reason)
        return first

    def refuse(self, reason: str) -> list[str]:
        """Refuse new Tasks from now on (``CLOSED``), leaving the running ones be; returns
        the ids not yet released (`close` lets them end by themselves for a while)."""
        with self._lock:
            self._closed_reason = reason
            tasks = list(self._live.values())
        return [task.id for task in tasks if not task.released.is_set()]

    def close(self, reason: str) -> list[str]:
        """Refuse new Tasks and abort every running one; returns the ids not yet released."""
        with self._lock:
            self._closed_reason = reason
            tasks = list(self._live.values())
        for task in tasks:
            if task.outcome is None:
                # Closing, not a kill: a run waiting for an approval answer parks instead
                # (its Task outlives the runtime); every other run is killed.
                self._abort(task, reason, cause=ErrorCode.CLOSED)
        return [task.id for task in tasks if not task.released.is_set()]

    def abandon(self, detail: str) -> int:
        """Settle every Task still running ``killed`` with ``detail``, and release every
        Task: `close` gave up waiting for their activations, and no caller may see a
        Task ``running`` after it. Returns how many were still running."""
        with self._lock:
            unreleased = [t for t in self._live.values() if not t.released.is_set()]
        running = 0
        for task in unreleased:
            if task.outcome is None:
                running += 1
                self.settle(
                    task.id,
                    TaskOutcome(status=TaskStatus.KILLED, detail=detail, code=ErrorCode.CLOSED),
                )
            self.release(task.id)
        return running
