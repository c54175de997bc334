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

from actors._inbox import ActivationInbox
from controlplane.contract import (
    CancelSignal,
    SubagentRun,
    SupervisorState,
    TaskStatus,
)

if TYPE_CHECKING:
    from actors._transcript import ActivationTranscript
    from actors.messages import ActivationPlan

__all__ = ["Activation", "ActivationSlot", "ActivationView"]


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
            cancel_reason=plan.signal.reason,
            started=self.started,
        )
        if self.slot is not None:
            self.slot.view = view
        return view
