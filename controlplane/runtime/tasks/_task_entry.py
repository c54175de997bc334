"""What the Task service is made of: a live Task's entry, the notice a settled one leaves
its owner, and what the service needs of the store and the router (its ports). Shared by
the book of live Tasks (`controlplane.runtime.tasks._task_book`) and the read side
(`controlplane.runtime.tasks._tasks`), so neither imports the other's internals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.contract import (
    LazyEvent,
    NewEvent,
    Requester,
    TaskNotice,
    TaskSnapshot,
    TaskStatus,
)
from controlplane.runtime._usage_text import spend_clause

if TYPE_CHECKING:
    from controlplane.contract import (
        ApprovalRequest,
        CancelSignal,
        TaskOutcome,
        Usage,
    )

__all__ = [
    "ActivationFacts",
    "Claimer",
    "Interrupter",
    "Opening",
    "QueuePlaces",
    "Requester",
    "TaskEntry",
    "TaskLedgerPort",
    "TaskListener",
    "TaskRouting",
    "notice_of",
]

TaskListener = Callable[[TaskSnapshot], object]


class ActivationFacts(Protocol):
    """What the ledger reads of an activation's published view (`actors.ActivationView`,
    frozen, owned by the child's supervisor)."""

    @property
    def task_id(self) -> str: ...

    @property
    def phase(self) -> str: ...


_AWAY = frozenset({"parking", "parked", "handed_over"})
"""An activation's phases in which its Task goes on (or will) without it, in the store."""

_VERBS = {
    TaskStatus.COMPLETED: "finished",
    TaskStatus.KILLED: "stopped",
    TaskStatus.FAILED: "failed",
    TaskStatus.INTERRUPTED: "was interrupted",
}
_INTERRUPTED_NOTICE = "its process ended before it finished; send it a message to continue"
_SUMMARY_LIMIT = 500


@dataclass(eq=False, slots=True)
class TaskEntry:
    """A Task whose activation exists in this runtime (running, or settled and not yet
    released). Once released it is kept only as a snapshot among the recent ones.

    The Task's state is one frozen `TaskSnapshot`, ``view`` (its store row's shape: status,
    owner, outcome, request, queue times), replaced whole under the service's lock on
    each change; everything else reads it there, so a reader without the lock never sees
    an outcome without its settlement time, and no second copy of a field can disagree
    with it. The activation's own state is its supervisor's record; ``activation`` is the
    last view of it the supervisor handed the ledger (`on_view`).
    """

    view: TaskSnapshot
    signal: CancelSignal
    activation: ActivationFacts | None = None
    # While it runs: what its turn has written so far (the transcript writer's total).
    meter: Callable[[], Usage] | None = None
    # Set only once the activation is gone from its supervisor, so `wait()` returning means
    # a follow-up starts the next activation.
    released: LazyEvent = field(default_factory=LazyEvent)
    # Set when `wait()` may return: released, or waiting for an answer (cleared once the
    # answer is taken, while the Task goes on).
    resting: LazyEvent = field(default_factory=LazyEvent)

    @property
    def id(self) -> str:
        return self.view.id

    @property
    def owner(self) -> str:
        """The session that owns it."""
        return self.view.owner_session

    @property
    def child_id(self) -> str | None:
        return self.view.child_id

    @property
    def outcome(self) -> TaskOutcome | None:
        return self.view.outcome

    @property
    def parked(self) -> bool:
        """Its run parks (or parked, or was handed over): the Task goes on in the store
        (a kill that finds it live must settle it there too)."""
        return self.activation is not None and self.activation.phase in _AWAY

    def ask_as(self, request: ApprovalRequest | None) -> TaskSnapshot:
        """Under the service's lock: waiting for ``request``'s answer (None: answered, or
        killed: it reads ``queued`` again while it holds its place in a queue, else
        ``running``)."""
        view = self.view
        status = view.status
        if request is not None:
            status = TaskStatus.INPUT_REQUIRED
        elif status is TaskStatus.INPUT_REQUIRED:
            waits = view.queued_at is not None and view.admitted_at is None
            status = TaskStatus.QUEUED if waits else TaskStatus.RUNNING
        # The view first: a waiter woken by ``resting`` reads it at once (without the lock).
        self.view = self._with({"request": request, "status": status})
        if request is not None:
            self.resting.set()
        elif not self.released.is_set():
            self.resting.clear()
        return self.view

    def queue_as(
        self, queued: bool, queued_at: datetime | None, admitted_at: datetime | None
    ) -> TaskSnapshot:
        """Under the service's lock: record its place in (or out of) a queue (a Task
        waiting for an answer reads ``input_required`` still)."""
        view = self.view
        status = view.status
        if status is not TaskStatus.INPUT_REQUIRED:
            status = TaskStatus.QUEUED if queued else TaskStatus.RUNNING
        self.view = self._with(
            {"status": status, "queued_at": queued_at, "admitted_at": admitted_at}
        )
        return self.view

    def settle_as(
        self, outcome: TaskOutcome, settled_at: datetime | None, usage: Usage | None = None
    ) -> TaskSnapshot:
        """Under the service's lock: record the outcome (and the spend the store kept with
        it, when it settled the Task itself) and publish the new view."""
        if usage is None and self.meter is not None:
            usage = self.meter()  # the turn has ended: its total is final
        self.meter = None
        self.view = self._with(
            {
                "status": outcome.status,
                "outcome": outcome,
                "settled_at": settled_at,
                "ended_at": settled_at,
                "usage": self.view.usage if usage is None else usage,
                "request": None,
            }
        )
        return self.view

    def _with(self, update: dict[str, Any]) -> TaskSnapshot:
        """Its view with ``update`` made (the view is replaced whole, never changed)."""
        return self.view.model_copy(update=update)

    def snapshot(self) -> TaskSnapshot:
        view, meter = self.view, self.meter
        if meter is None or view.outcome is not None:
            return view
        spent = meter()  # a running turn's spend so far: read when asked, not per call
        return view if spent is view.usage else view.model_copy(update={"usage": spent})


class TaskLedgerPort(Protocol):
    """What the Task service needs of the store (`persistence.TaskLedger`)."""

    def admit(self, task: TaskSnapshot) -> None: ...
    def settle(self, settlement: tuple[str, TaskOutcome, datetime]) -> bool: ...
    def get(self, task_id: str) -> TaskSnapshot | None: ...
    def owned_by(self, owner_session: str) -> list[TaskSnapshot]: ...
    def drain(self, owner_session: str) -> list[TaskSnapshot]: ...
    def forget(self, task_id: str) -> None: ...
    def running_spend(self, task: TaskSnapshot) -> Usage: ...


Claimer = Callable[[TaskSnapshot, Sequence[NewEvent]], int | None]
"""Admits a resume's Task and claims its child in one write, with the events that open its
turn (its frame: durable before ``started`` is answered); returns the fencing number."""

Opening = Callable[[TaskSnapshot], Sequence[NewEvent]]
"""The events that open a resume's turn, made once its Task (id, label) exists."""


class TaskRouting(Protocol):
    """What the Task service asks of the runtime's router
    (`controlplane.runtime.routing._router.Router`).

    The router is built before this service and is not given it (a kill forwarded here
    reaches this service through a callable of the facade's), so construction runs one way
    and nothing is wired after it."""

    def claim(self, task: TaskSnapshot, opening: Sequence[NewEvent] = ()) -> int | None:
        """Admit a resume's Task and claim its child in one write, with the events that
        open its turn; the fencing number."""
        ...

    def kill_elsewhere(self, task: TaskSnapshot, reason: str) -> None:
        """Kill a running Task of another runtime (the router decides how)."""
        ...


class QueuePlaces(Protocol):
    """What the Task service needs of the admission queue (`persistence.AdmissionQueue`)."""

    def with_places(self, snapshots: list[TaskSnapshot]) -> list[TaskSnapshot]: ...


Interrupter = Callable[[TaskSnapshot], object]
"""Writes a fenced Task's ``interrupted`` settlement with its turn's end (the runtime's
`persistence.SqlStore.interrupt`); raises ``SubagentControlError`` when the store refuses."""


def notice_of(snapshot: TaskSnapshot) -> TaskNotice:
    """The completion notice a settled Task leaves its owner (a one-line summary)."""
    outcome = snapshot.outcome
    assert outcome is not None
    text = outcome.output if outcome.status is TaskStatus.COMPLETED else outcome.detail
    if outcome.status is TaskStatus.INTERRUPTED:
        text = _INTERRUPTED_NOTICE
    body = " ".join((text or "").split())
    if len(body) > _SUMMARY_LIMIT:
        body = body[: _SUMMARY_LIMIT - 1] + "…"
    summary = (
        f"subagent task {snapshot.id} ({snapshot.label}) {_VERBS[outcome.status]}"
        f"{spend_clause(snapshot.usage)}"
    )
    return TaskNotice(
        task_id=snapshot.id,
        child_id=snapshot.child_id,
        label=snapshot.label,
        status=outcome.status,
        summary=f"{summary}: {body}" if body else summary,
    )
