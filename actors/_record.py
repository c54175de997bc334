"""The one record of a running activation, and the snapshot other threads read of it.

An activation's state used to be spread over its Task (status, owner, fence, read by the
supervisor through the Task service without its lock), the supervisor's association (run,
transcript, settling flag, held messages), the transcript writer, the signal and the
trace. Now one `Activation` holds it, owned by the child's supervisor: it is changed only
on the supervisor's thread (by the supervisor's own decisions, and by the messages the
activation actor sends it: `Published`, `Settling`, `ActivationEnded`). After every change
the supervisor publishes a frozen `ActivationView` (one attribute swap, so a reader on any
thread sees a whole snapshot, never a half-made one); the tree dump and anyone else who
asks "what is this activation doing" read that.

The Task service keeps the Task's *ledger* (what the parent observes: its snapshot, wait,
notices, the store's row) — the durable projection of this record, not a second owner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pykka

from actors._inbox import ActivationInbox, Held
from controlplane.contract import (
    CancelSignal,
    SubagentRun,
    SupervisorState,
    TaskStatus,
)

if TYPE_CHECKING:
    from actors._transcript import ActivationTranscript
    from actors.messages import ActivationPlan

__all__ = ["Activation", "ActivationPhase", "ActivationSlot", "ActivationView"]

ActivationPhase = Literal["admitted", "published", "settling", "parked", "handed_over", "ended"]
"""Where an activation is in its life (its supervisor's record, `Activation.advance`):

- ``admitted``: its Task exists and the activation began (loading, framing, waiting for
  a slot, starting its run); a ``recovered`` or ``continued`` one goes on in a turn its
  Task opened earlier (``ActivationPlan.kind`` and ``recovery`` say which);
- ``published``: its run is live here and takes steers;
- ``settling``: its run's result is in (or it is stopping); it takes no more messages;
- ``parked``: its run ended waiting on an approval answer: the Task goes on in the
  store, ``input_required``, and its answer continues it in any runtime (SPEC §11);
- ``handed_over``: `close()` stopped its run mid-turn: the Task stays ``running`` in
  the store, its turn open, and a live runtime with its provider recovers it (SPEC §9);
- ``ended``: its Task settled here.

The last three are final; the supervisor then drops the record.
"""

_NEXT: dict[str, frozenset[str]] = {
    "admitted": frozenset({"published", "settling", "ended"}),
    "published": frozenset({"settling", "ended"}),
    "settling": frozenset({"parked", "handed_over", "ended"}),
    "parked": frozenset(),
    "handed_over": frozenset(),
    "ended": frozenset(),
}


@dataclass(frozen=True, slots=True)
class ActivationView:
    """An immutable snapshot of one activation, as its supervisor last published it."""

    task_id: str
    child_id: str
    kind: Literal["initial", "resumed", "continued"]
    owner_session: str
    fence: int | None
    status: TaskStatus
    """``running`` while the activation exists here; its terminal status once it ended
    (the supervisor then drops the record)."""
    phase: ActivationPhase
    recovery: int
    """How many times its Task's turn was recovered (this activation's included)."""
    published: bool
    settling: bool
    """The run's result is in; dispose and the outcome follow."""
    cancel_reason: str | None
    started: float
    """When it was admitted (monotonic seconds)."""

    @property
    def state(self) -> SupervisorState:
        """The supervisor's state while this activation is its current one."""
        if self.status is not TaskStatus.RUNNING or self.cancel_reason is not None:
            return "settling"
        if self.settling:
            return "settling"
        return "running" if self.published else "starting"


class ActivationSlot:
    """Where a supervisor publishes the view of its current activation (None when idle):
    one attribute, swapped whole, read lock-free from any thread (the supervisor's proxy)."""

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: ActivationView | None = None


@dataclass(slots=True, eq=False)
class Activation:
    """The record of one running activation; mutated on its supervisor's thread only."""

    plan: ActivationPlan
    inbox: ActivationInbox
    # Agents registered after this mark may be the provider's child agent being created.
    agent_mark: int
    started: float = field(default_factory=time.monotonic)
    ref: pykka.ActorRef[Any] | None = None  # the activation actor, once it began
    run: SubagentRun | None = None
    transcript: ActivationTranscript | None = None
    settling: bool = False
    status: TaskStatus = TaskStatus.RUNNING
    slot: ActivationSlot | None = None  # where its view is published
    phase: ActivationPhase = "admitted"
    # Messages held while its run parks, in arrival order: delivered once it has parked.
    held: list[Held] = field(default_factory=list)

    def advance(self, phase: ActivationPhase) -> bool:
        """Move to ``phase`` (on the supervisor's thread), if it follows the current one;
        whether it moved. A phase already reached is no move (messages may repeat it)."""
        if phase == self.phase or phase not in _NEXT[self.phase]:
            return False
        self.phase = phase
        if phase == "settling":
            self.settling = True
        return True

    @property
    def task_id(self) -> str:
        """The id of the Task this activation produces."""
        return self.plan.task_id

    @property
    def signal(self) -> CancelSignal:
        """Its out-of-band cancellation (thread-safe, first reason wins)."""
        return self.plan.signal

    @property
    def owner_session(self) -> str:
        """The session that owns its Task (the parent it runs for)."""
        return self.plan.parent.session_id

    def publish_view(self) -> ActivationView:
        """Publish a fresh snapshot (after a change, on the supervisor's thread)."""
        plan = self.plan
        view = ActivationView(
            task_id=plan.task_id,
            child_id=plan.child_id,
            kind=plan.kind,
            owner_session=plan.parent.session_id,
            fence=plan.fence,
            status=self.status,
            published=self.run is not None,
            settling=self.settling,
            phase=self.phase,
            recovery=plan.recovery,
            cancel_reason=plan.signal.reason,
            started=self.started,
        )
        if self.slot is not None:
            self.slot.view = view
        return view
