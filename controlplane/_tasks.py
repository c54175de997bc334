"""The Task service: what parents observe of activations, fenced by owner session."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.contract import (
    AgentHandle,
    CancelSignal,
    ErrorCode,
    SubagentControlError,
    TaskNotice,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from controlplane.telemetry import Telemetry, log_kill, log_settled

__all__ = [
    "Claimer",
    "Interrupter",
    "TaskLedgerPort",
    "TaskListener",
    "TaskNotice",
    "TaskRouting",
    "TaskService",
]

log = logging.getLogger(__name__)

TaskListener = Callable[[TaskSnapshot], object]
Requester = AgentHandle | str

_VERBS = {
    TaskStatus.COMPLETED: "finished",
    TaskStatus.KILLED: "stopped",
    TaskStatus.FAILED: "failed",
    TaskStatus.INTERRUPTED: "was interrupted",
}
_INTERRUPTED_NOTICE = "its process ended before it finished; send it a message to continue"
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.5
_SUMMARY_LIMIT = 500


@dataclass(eq=False)
class _Task:
    """A Task whose activation exists in this runtime (running, or settled and not yet
    released). Once released it is kept only as a snapshot among the recent ones.

    The ledger's entry, not the activation's state (its supervisor's `Activation` record
    holds that): changed only under the service's lock (`settle_as`), and read from other
    threads only through ``view``, a frozen snapshot swapped whole on each change, so a
    reader without the lock never sees an outcome without its settlement time.
    """

    id: str
    label: str
    owner: str
    child_id: str | None
    signal: CancelSignal
    runtime_id: str | None
    created_at: datetime = field(default_factory=utcnow)
    fence: int | None = None  # the claim's fencing number, for a Task that claimed its child
    outcome: TaskOutcome | None = None
    settled_at: datetime | None = None
    # Set only once the activation is gone from its supervisor, so `wait()` returning means
    # a follow-up starts the next activation.
    released: threading.Event = field(default_factory=threading.Event)
    view: TaskSnapshot = field(init=False)

    def __post_init__(self) -> None:
        self.view = self._build()

    @property
    def status(self) -> TaskStatus:
        return TaskStatus.RUNNING if self.outcome is None else self.outcome.status

    def settle_as(self, outcome: TaskOutcome, settled_at: datetime | None) -> TaskSnapshot:
        """Under the service's lock: record the outcome and publish the new view."""
        self.outcome, self.settled_at = outcome, settled_at
        self.view = self._build()
        return self.view

    def snapshot(self) -> TaskSnapshot:
        return self.view

    def _build(self) -> TaskSnapshot:
        return TaskSnapshot(
            id=self.id,
            label=self.label,
            owner_session=self.owner,
            status=self.status,
            outcome=self.outcome,
            child_id=self.child_id,
            runtime_id=self.runtime_id,
            created_at=self.created_at,
            settled_at=self.settled_at,
            ended_at=self.settled_at,
        )


class TaskLedgerPort(Protocol):
    """What the Task service needs of the store (`persistence.TaskLedger`)."""

    def admit(self, task: TaskSnapshot) -> None: ...
    def settle(self, settlement: tuple[str, TaskOutcome, datetime]) -> bool: ...
    def get(self, task_id: str) -> TaskSnapshot | None: ...
    def owned_by(self, owner_session: str) -> list[TaskSnapshot]: ...
    def drain(self, owner_session: str) -> list[TaskSnapshot]: ...
    def forget(self, task_id: str) -> None: ...


Claimer = Callable[[TaskSnapshot], int | None]
"""Admits a resume's Task and claims its child in one write; returns the fencing number."""


class TaskRouting(Protocol):
    """What the Task service asks of the runtime's router (`controlplane._router.Router`).

    The router is built before this service and is not given it (a kill forwarded here
    reaches this service through a callable of the facade's), so construction runs one way
    and nothing is wired after it."""

    def claim(self, task: TaskSnapshot) -> int | None:
        """Admit a resume's Task and claim its child in one write; the fencing number."""
        ...

    def kill_elsewhere(self, task: TaskSnapshot, reason: str) -> None:
        """Kill a running Task of another runtime (the router decides how)."""
        ...


Interrupter = Callable[[TaskSnapshot], object]
"""Writes a fenced Task's ``interrupted`` settlement with its turn's end (the runtime's
`persistence.SqlStore.interrupt`); raises ``SubagentControlError`` when the store refuses."""


class TaskService:
    """Registers, settles and exposes Tasks. Thread-safe.

    Access is fenced by owner session: ``get``, ``wait``, ``kill`` and ``output`` by anyone
    but the owner raise ``TASK_NOT_FOUND`` exactly as for an unknown id.

    With a ledger (the store's), every Task is kept there: written when admitted and when
    settled, read back for Tasks this runtime does not hold (other runtimes', earlier
    processes'), and completion notices are drained from it, once across every runtime.
    In memory it keeps only live Tasks and the ``recent`` newest settled ones.

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
    ) -> None:
        self._lock = threading.Lock()
        self._max_live = max_live
        self._ledger = ledger
        self._runtime_id = runtime_id
        self._recent_cap = recent
        self.telemetry = telemetry or Telemetry(runtime_id or "", enabled=False)
        self._live: dict[str, _Task] = {}  # activations that exist: running or unreleased
        self._recent: OrderedDict[str, TaskSnapshot] = OrderedDict()
        self._unsaved: dict[str, tuple[str, TaskOutcome, datetime]] = {}
        # Fenced Tasks' settlements, written by the runtime's thread (`flush`), never by
        # the activation's: its runtime may be cut off from the store (SPEC §9).
        self._unsaved_fenced: dict[str, TaskSnapshot] = {}
        self._interrupter = interrupter
        self._suspended: str | None = None  # why new Tasks are refused for now
        self._listeners: list[TaskListener] = []
        self._notices: dict[str, deque[TaskNotice]] = {}  # without a ledger only
        self._surfaces: set[str] = set()
        self._closed_reason: str | None = None
        self._routing = routing
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

    # -- fencing (the runtime's lease watchdog, SPEC §9) ------------------------------

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

    # -- producer side (the control plane) -------------------------------------------

    def start(
        self,
        *,
        label: str,
        owner: Requester,
        child_id: str | None,
        signal: CancelSignal,
        claim_child: bool = False,
    ) -> TaskSnapshot:
        """Register a running Task of kind ``subagent`` (and write it to the store).

        Raises:
            SubagentControlError: ``NO_CONTROL_SURFACE`` without an attached surface,
                ``CLOSED`` once `close` was called, ``UNAUTHORIZED`` when the owner's
                `AgentHandle` is no longer live, ``CAPACITY`` at the cap on live
                activations, ``STORE_UNAVAILABLE`` when the store cannot record it (nothing
                is left behind); with ``claim_child`` (a resume: the Task is admitted with
                the claim on its child, `fence_of`), ``OWNERSHIP_CONFLICT`` when another
                live runtime holds the child.
        """
        task = _Task(
            id=str(uuid.uuid4()),
            label=label,
            owner=_session_of(owner),
            child_id=child_id,
            signal=signal,
            runtime_id=self._runtime_id,
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
        claimer = self._claimer if claim_child else None
        try:
            if claimer is not None:
                # A settlement the store refused may hold this child's claim and leave its
                # turn open: written first, the claim below finds the turn closed as the
                # Task says (else the takeover would close it with words of its own).
                if self._unsaved or self._unsaved_fenced:
                    self.flush(child_id)
                task.fence = claimer(snapshot)
            elif self._ledger is not None:
                self._ledger.admit(snapshot)
        except BaseException:
            with self._lock:
                self._live.pop(task.id, None)
            raise
        return snapshot

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
                self._notices.setdefault(task.owner, deque()).append(_notice(snapshot))
            listeners = list(self._listeners)
        log_settled(snapshot, self._runtime_id)
        if self._ledger is not None and not persisted:
            if outcome.code is ErrorCode.FENCED and self._interrupter is not None:
                with self._lock:
                    self._unsaved_fenced[task_id] = snapshot
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
                task.settle_as(stored.outcome, stored.settled_at)
            elif task_id in self._recent:
                self._recent[task_id] = stored

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
                self._interrupter(snapshot)  # False: someone settled it already; fine
            except SubagentControlError as exc:
                log.warning("could not record the interruption of task %s (%s); will retry",
                            snapshot.id, exc.message)  # fmt: skip
                continue
            with self._lock:
                self._unsaved_fenced.pop(snapshot.id, None)
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

    def _remember(self, snapshot: TaskSnapshot) -> None:
        """Under the lock: keep a settled Task among the recent ones (bounded)."""
        self._recent[snapshot.id] = snapshot
        while len(self._recent) > self._recent_cap:
            self._recent.popitem(last=False)

    def fence_of(self, task_id: str) -> int | None:
        """The fencing number a live Task of this runtime claimed its child under (read
        once, by the supervisor that just started it, into the activation's record: an
        activation's status, owner and fence are read from that record, not from here)."""
        with self._lock:
            task = self._live.get(task_id)
            return None if task is None else task.fence

    def running(self) -> list[TaskSnapshot]:
        """The Tasks running in this runtime (unfenced)."""
        with self._lock:
            return [t.snapshot() for t in self._live.values() if t.outcome is None]

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

    def _abort(self, task: _Task, reason: str) -> bool:
        """Abort a Task's signal: the first abort is its kill (logged)."""
        first = task.signal.abort(reason)
        if first:
            log_kill(task.child_id, task.id, self._runtime_id, reason)
        return first

    def close(self, reason: str) -> list[str]:
        """Refuse new Tasks and abort every running one; returns the ids not yet released."""
        with self._lock:
            self._closed_reason = reason
            tasks = list(self._live.values())
        for task in tasks:
            if task.outcome is None:
                self._abort(task, reason)
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

    def wait_released(self, task_id: str, timeout: float | None) -> bool:
        """Wait (unfenced) until a Task of this runtime is released; returns whether it was."""
        task = self._live.get(task_id)
        return True if task is None else task.released.wait(timeout)

    # -- owner side (public) ---------------------------------------------------------

    def get(self, task_id: str, *, requester: Requester) -> TaskSnapshot:
        """A snapshot of one of the requester's Tasks, from any runtime.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND`` for an unknown id or another owner.
        """
        return self._fenced(task_id, requester)

    def wait(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Block until the Task has settled and its activation is gone; return its snapshot.

        A Task of another runtime is polled in the store (with backoff) until it settles
        there, or until its runtime is found dead and it is settled ``interrupted``.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; ``TIMEOUT`` if it has not settled
                within ``timeout`` seconds (the Task keeps running).
        """
        snapshot = self._fenced(task_id, requester)
        deadline = None if timeout is None else time.monotonic() + timeout
        live = self._live.get(snapshot.id)
        if live is not None:
            if live.released.wait(timeout):
                return self._fenced(task_id, requester)
        elif snapshot.status.is_terminal:
            return snapshot
        else:
            pause = _POLL_FIRST_S
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, _POLL_MAX_S)
                snapshot = self._fenced(task_id, requester)
                if snapshot.status.is_terminal:
                    return snapshot
        raise SubagentControlError(
            ErrorCode.TIMEOUT,
            f"task {task_id} is still {snapshot.status.value} after {timeout}s; wait again",
            task_id=task_id,
        )

    def kill(self, task_id: str, *, requester: Requester) -> None:
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
        reason = f"killed by {_session_of(requester)}"
        live = self._live.get(snapshot.id)
        if live is not None:
            self._abort(live, reason)
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

    def drain_notices(self, requester: Requester) -> list[TaskNotice]:
        """Take the requester's pending completion notices (one per settled Task, in any
        runtime, ``interrupted`` ones included), oldest first. Each is taken once."""
        owner = _session_of(requester)
        if self._ledger is not None:
            return [_notice(snapshot) for snapshot in self._ledger.drain(owner)]
        with self._lock:
            pending = self._notices.pop(owner, None)
        return list(pending or ())

    def list(self, requester: Requester) -> list[TaskSnapshot]:
        """The requester's Tasks (of every runtime), oldest first."""
        owner = _session_of(requester)
        with self._lock:
            mine = {t.id: t.snapshot() for t in self._live.values() if t.owner == owner}
        if self._ledger is None:
            return sorted(mine.values(), key=lambda t: t.created_at)
        # The store has every Task; this runtime's own view wins for the ones it holds
        # (a settlement the store has not taken yet).
        return [mine.get(t.id, t) for t in self._ledger.owned_by(owner)]

    def latest_by_child(self, requester: Requester) -> dict[str, TaskSnapshot]:
        """The newest Task of each of the requester's children."""
        return {t.child_id: t for t in self.list(requester) if t.child_id is not None}

    def _fenced(self, task_id: object, requester: Requester) -> TaskSnapshot:
        owner = _session_of(requester)
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
    if outcome.status is TaskStatus.INTERRUPTED:
        text = _INTERRUPTED_NOTICE
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
