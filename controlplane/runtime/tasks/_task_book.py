"""The book of live Tasks: the runtime's record of the Tasks whose activations exist here,
which the actors write through (start, settle, release) and the runtime drives (fencing,
flushing refused settlements, closing). The read side
(`controlplane.runtime.tasks._tasks.TaskService`) is built on it; callers see that through
`controlplane.runtime._task_view.Tasks`. This module admits Tasks and follows them while
they run; how they end (fenced, killed, closed, settled, released) is `TaskEndings`
(`controlplane.runtime.tasks._task_endings`), which the book inherits."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from controlplane.contract import (
    AgentHandle,
    ErrorCode,
    SubagentControlError,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    requester_session,
    utcnow,
)
from controlplane.runtime.tasks._task_endings import TaskEndings
from controlplane.runtime.tasks._task_entry import (
    TaskEntry,
)
from controlplane.telemetry import Telemetry

if TYPE_CHECKING:
    from controlplane.contract import (
        ApprovalRequest,
        CancelSignal,
        TaskNotice,
        Usage,
    )
    from controlplane.runtime.tasks._task_entry import (
        ActivationFacts,
        Claimer,
        Interrupter,
        Opening,
        QueuePlaces,
        Requester,
        TaskLedgerPort,
        TaskListener,
        TaskRouting,
    )

__all__ = ["TaskBook"]


def _no_opening(_task: TaskSnapshot) -> tuple[()]:
    return ()


log = logging.getLogger(__name__)


class TaskBook(TaskEndings):
    """Registers and settles the Tasks of this runtime's activations. Thread-safe.

    The actors' side of the Task service (the contract's `TaskService` Protocol): an
    activation's Task is admitted here when it starts, settled when it ends and released
    once its activation is gone. With a ledger (the store's), every Task is written there
    when admitted and when settled. In memory it keeps only live Tasks and the ``recent``
    newest settled ones.

    Args:
        max_live: The most Tasks whose activation may exist at once (``CAPACITY`` past it).
        ledger: The store's Task rows; None keeps Tasks in memory only.
        runtime_id: This runtime's id, recorded with each Task.
        recent: How many settled Tasks to keep in memory.
        telemetry: The control plane's spans, metrics and logs (the actors reach it here);
            spans and metrics off when None.
        routing: Claims a resume's child and kills Tasks of other runtimes (the router);
            None when Tasks live in this process only.
        interrupter: Writes a fenced Task's settlement (`Interrupter`, the runtime's);
            None without a store.
        queue: Fills in queued Tasks' queue positions (the store's admission queue);
            None without a store.
    """

    def __init__(
        self,
        *,
        max_live: int | None = None,
        ledger: TaskLedgerPort | None = None,
        runtime_id: str | None = None,
        recent: int = 1000,
        telemetry: Telemetry | None = None,
        routing: TaskRouting | None = None,
        interrupter: Interrupter | None = None,
        queue: QueuePlaces | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._max_live = max_live
        self._ledger = ledger
        self._runtime_id = runtime_id
        self._recent_cap = recent
        self.telemetry = telemetry or Telemetry(runtime_id or "", enabled=False)
        self._live: dict[str, TaskEntry] = {}  # activations that exist: running or unreleased
        self._recent: OrderedDict[str, TaskSnapshot] = OrderedDict()
        self._unsaved: dict[str, tuple[str, TaskOutcome, datetime]] = {}
        # Fenced Tasks' settlements, written by the runtime's thread (`flush`), never by
        # the activation's: its runtime may be cut off from the store.
        self._unsaved_fenced: dict[str, TaskSnapshot] = {}
        self._interrupter = interrupter
        self._suspended: str | None = None  # why new Tasks are refused for now
        self._listeners: list[TaskListener] = []
        self._rest_listeners: list[TaskListener] = []  # a Task starts waiting for an answer
        self._notices: dict[str, deque[TaskNotice]] = {}  # without a ledger only
        self._surfaces: set[str] = set()
        self._closed_reason: str | None = None
        self._routing = routing
        self._queue = queue
        # The claim on its own: the benchmark of a resume's admission times it here.
        self._claimer: Claimer | None = routing.claim if routing is not None else None

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
        self,
        *,
        label: str,
        owner: Requester,
        child_id: str | None,
        signal: CancelSignal,
        queued: bool = False,
    ) -> TaskSnapshot:
        """Register a running Task of kind ``subagent`` (and write it to the store);
        ``queued``: it reads ``queued`` until its admission decides (`admitted`).

        Raises:
            SubagentControlError: ``NO_CONTROL_SURFACE`` without an attached surface,
                ``CLOSED`` once `close` was called, ``UNAUTHORIZED`` when the owner's
                `AgentHandle` is no longer live, ``CAPACITY`` at the cap on live
                activations, ``STORE_UNAVAILABLE`` when the store cannot record it (nothing
                is left behind).
        """
        return self._start(label, owner, child_id, signal, queued, None)[0]

    def claim(
        self,
        *,
        label: str,
        owner: Requester,
        child_id: str,
        signal: CancelSignal,
        queued: bool = False,
        opening: Opening | None = None,
    ) -> tuple[TaskSnapshot, int | None]:
        """Register a resume's Task as `start` does, admitted in the store with the claim
        on its child and the events that open its turn (``opening``); returns its
        snapshot and the fencing number the claim holds (None with no router: the Task
        lives in this process only).

        Raises:
            SubagentControlError: as `start`; ``OWNERSHIP_CONFLICT`` when another live
                runtime holds the child.
        """
        return self._start(label, owner, child_id, signal, queued, opening or _no_opening)

    def _start(
        self,
        label: str,
        owner: Requester,
        child_id: str | None,
        signal: CancelSignal,
        queued: bool,
        opening: Opening | None,
    ) -> tuple[TaskSnapshot, int | None]:
        """`start`, or with ``opening`` `claim`."""
        task = TaskEntry(
            TaskSnapshot(
                id=str(uuid.uuid4()),
                label=label,
                owner_session=requester_session(owner),
                status=TaskStatus.QUEUED if queued else TaskStatus.RUNNING,
                child_id=child_id,
                runtime_id=self._runtime_id,
                created_at=utcnow(),
            ),
            signal,
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
            if self._suspended is not None:
                raise SubagentControlError(
                    ErrorCode.STORE_UNAVAILABLE,
                    f"this runtime cannot act until it renews its lease ({self._suspended}); "
                    "nothing was started; retry once the store is reachable",
                    child_id=child_id,
                )
            self.require_surface()
            if self._max_live is not None and len(self._live) >= self._max_live:
                raise SubagentControlError(
                    ErrorCode.CAPACITY,
                    f"{len(self._live)} activations are live, the cap (max_live_activations="
                    f"{self._max_live}); nothing was started; retry once some have settled",
                    child_id=child_id,
                )
            self._live[task.id] = task
        snapshot = task.snapshot()
        claimer = self._claimer if opening is not None else None
        fence: int | None = None
        try:
            if claimer is not None:
                assert opening is not None
                # A settlement the store refused may hold this child's claim and leave its
                # turn open: written first, the claim below finds the turn closed as the
                # Task says (else the takeover would close it with words of its own).
                if self._unsaved or self._unsaved_fenced:
                    self.flush(child_id)
                fence = claimer(snapshot, opening(snapshot))
            elif self._ledger is not None:
                self._ledger.admit(snapshot)
        except BaseException:
            with self._lock:
                self._live.pop(task.id, None)
            raise
        return snapshot, fence

    def queue(self, task_id: str, at: datetime) -> None:
        """The Task waits for a slot under a concurrency limit from ``at`` on."""
        with self._lock:
            task = self._live.get(task_id)
            if task is not None and task.outcome is None:
                task.queue_as(True, at, None)

    def admitted(self, task_id: str, at: datetime | None) -> None:
        """The Task holds its slot (``at``: when it got it after waiting; None: it never
        waited) and reads ``running``."""
        with self._lock:
            task = self._live.get(task_id)
            if task is not None and task.outcome is None:
                queued_at = task.view.queued_at
                task.queue_as(False, queued_at, at if queued_at is not None else None)

    def take_over_queued(self, task: TaskSnapshot, signal: CancelSignal) -> None:
        """Hold a queued Task that a dead runtime left (adopted: same id, now run here);
        the store already names this runtime for it.

        Raises:
            SubagentControlError: ``CLOSED`` once `close` was called; ``STORE_UNAVAILABLE``
                while fenced.
        """
        self._take_over(task, signal, status=TaskStatus.QUEUED, queued_at=task.queued_at)

    def take_over_parked(self, task: TaskSnapshot, signal: CancelSignal) -> None:
        """Hold a Task parked on an approval request, which this runtime now continues
        (same id, same turn; the store already names this runtime for it).

        Raises:
            SubagentControlError: ``CLOSED`` once `close` was called; ``STORE_UNAVAILABLE``
                while fenced.
        """
        status = TaskStatus.INPUT_REQUIRED if task.request is not None else TaskStatus.RUNNING
        self._take_over(task, signal, status=status, request=task.request)

    def _take_over(self, task: TaskSnapshot, signal: CancelSignal, **state: Any) -> None:
        """Hold a stored Task this runtime now runs (same id), in ``state``."""
        entry = TaskEntry(
            TaskSnapshot(
                id=task.id,
                label=task.label,
                owner_session=task.owner_session,
                child_id=task.child_id,
                runtime_id=self._runtime_id,
                created_at=task.created_at,
                recoveries=task.recoveries,
                **state,
            ),
            signal,
        )
        if entry.view.request is not None:
            entry.resting.set()
        with self._lock:
            if self._closed_reason is not None:
                raise SubagentControlError(
                    ErrorCode.CLOSED, "the control plane is closed; nothing was taken over"
                )
            if self._suspended is not None:
                raise SubagentControlError(
                    ErrorCode.STORE_UNAVAILABLE,
                    f"this runtime cannot act until it renews its lease ({self._suspended})",
                    task_id=task.id,
                )
            self._live[task.id] = entry

    def asking(self, task_id: str, request: ApprovalRequest | None) -> None:
        """The Task waits for ``request``'s answer (it reads ``input_required``, and its
        waiters return); None: the answer was taken and it runs again."""
        with self._lock:
            task = self._live.get(task_id)
            if task is None or task.outcome is not None:
                return
            snapshot = task.ask_as(request)
            listeners = list(self._rest_listeners) if request is not None else []
        for listener in listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("listener %r failed for task %s", listener, task_id)

    def on_view(self, view: ActivationFacts) -> None:
        """An activation's supervisor published ``view``: the entry of its Task follows
        its phase (the record is the activation's; this is its projection). Parking, a
        kill from now on settles the Task in the store too; parked or handed over, the
        entry is gone (`park`); ended, `wait` returns (`release`)."""
        with self._lock:
            task = self._live.get(view.task_id)
            if task is not None:
                task.activation = view
        if view.phase in ("parked", "handed_over"):
            self.park(view.task_id)
        elif view.phase == "ended":
            self.release(view.task_id)

    def park(self, task_id: str) -> TaskEntry | None:
        """The Task's run parked on an approval request: its activation is gone from this
        runtime, the Task goes on in the store (``input_required``), not settled. Returns
        its entry as it was."""
        with self._lock:
            task = self._live.pop(task_id, None)
        if task is not None:
            task.resting.set()
            task.released.set()
        return task

    def discard(self, task_id: str) -> None:
        """Forget a Task that never ran (its start was refused after registration): it
        settles ``failed`` in the store, where it was already recorded, with no notice."""
        with self._lock:
            task = self._live.pop(task_id, None)
        if task is None:
            return
        task.released.set()
        if self._ledger is not None:
            # The caller was never told of it: it is no Task of theirs, in the store either.
            with contextlib.suppress(SubagentControlError):
                self._ledger.forget(task_id)

    def meter(self, task_id: str, spent: Callable[[], Usage]) -> None:
        """Read a running Task's ``usage`` from ``spent`` until it settles (then it keeps
        what ``spent`` said at settlement)."""
        with self._lock:
            task = self._live.get(task_id)
            if task is not None and task.outcome is None:
                task.meter = spent

    def running(self) -> list[TaskSnapshot]:
        """The Tasks running in this runtime (unfenced)."""
        with self._lock:
            return [t.snapshot() for t in self._live.values() if t.outcome is None]
