"""The one record of a running activation, its state machine, and the snapshot other
threads read of it.

One `Activation` holds an activation's state, owned by the child's supervisor: it changes
only on the supervisor's thread, through one function, `Activation.apply(event) ->
effects` (Temporal's workflow activation: what happened in, what to do out). The events
are the activation actor's reports (`Claimed`, `ClaimFailed`, `RunPublished`,
`RunSettling`, `RunEnded`) and the supervisor's own findings (`Parking`, `MessageHeld`,
`Broke`); the effects are what the supervisor then does (open or close the inbox, deliver
the held messages, release the Task, retire). `_TABLE` lists every legal ``(phase, event)
-> (phase, effects)``; an event the table does not list is a bug elsewhere: logged and
ignored, never a silent change.

A resume begins ``claiming``: its store work (the budget check, then the Task admitted with
the child's claim and the message in its turn) is an effect run off the supervisor's
mailbox, by the activation it starts, whose result comes back as `Claimed` or
`ClaimFailed`. A parked Task's continuation begins ``claiming`` too, through the same rows:
its budget check and the parked Task claimed for this runtime run in the activation it
starts (`Claimed`: the continued turn takes its message; `ClaimFailed`: another runtime
continues it, or, with no provider here, its message went into the parked turn in the
store and its sender was answered ``steered``). Messages that come meanwhile are held,
and decided afresh once the claim's result is in, so the mailbox keeps serving (a status
ask, another message) while the store works.

The table (``*``: any of ``claiming``, ``admitted``, ``published``, ``settling``,
``parking``):

========= =========================== =========== ============================================
phase     event                       next        effects
========= =========================== =========== ============================================
claiming  MessageHeld                 claiming    hold
claiming  Claimed                     admitted    make_inbox, release_held
claiming  ClaimFailed                 refused     refuse_claim, redecide, close_inbox, drop
claiming  ClaimFailed:parked          refused     continue_parked, close_inbox, drop
claiming  ClaimFailed:child_not_found refused     refuse_claim, refuse_held, close_inbox, drop
admitted  RunPublished                published   open_inbox
admitted  RunSettling                 settling
admitted  RunEnded:ended              ended       redecide, close_inbox, drop, notify_ledger
published RunSettling                 settling
published RunSettling:input_required  parking     notify_ledger
published Parking                     parking     notify_ledger
published RunEnded:ended              ended       redecide, close_inbox, drop, notify_ledger
settling  MessageHeld                 settling    hold
settling  RunEnded:ended              ended       redecide, close_inbox, drop, notify_ledger
settling  RunEnded:handed_over        handed_over redecide, close_inbox, drop, notify_ledger
parking   RunSettling                 parking
parking   RunSettling:input_required  parking
parking   Parking                     parking
parking   MessageHeld                 parking     hold
parking   RunEnded:parked             parked      hand_back, close_inbox, drop, notify_ledger
parking   RunEnded:ended              ended       redecide, close_inbox, drop, notify_ledger
parking   RunEnded:handed_over        handed_over redecide, close_inbox, drop, notify_ledger
``*``     Broke                       (same)      close_inbox
========= =========================== =========== ============================================

After every change the record publishes a frozen `ActivationView` (one attribute swap, so
a reader on any thread sees a whole snapshot, never a half-made one); the tree dump and
anyone else who asks "what is this activation doing" read that. The Task ledger keeps the
Task's durable projection (its snapshot, wait, notices, the store's row), not a second
owner of this state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import pykka

from actors._inbox import ActivationInbox, Held
from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    ParkedTask,
    SubagentControlError,
    SubagentRun,
    SupervisorState,
    TaskStatus,
)

if TYPE_CHECKING:
    from actors._transcript import ActivationTranscript
    from actors.messages import ActivationPlan, ResumeClaim

__all__ = [
    "Activation",
    "ActivationEvent",
    "ActivationPhase",
    "ActivationSlot",
    "ActivationView",
    "Broke",
    "ClaimFailed",
    "Claimed",
    "Effect",
    "MessageHeld",
    "Parking",
    "RunEnded",
    "RunPublished",
    "RunSettling",
    "view_of",
]

log = logging.getLogger(__name__)

ActivationPhase = Literal[
    "claiming",
    "admitted",
    "published",
    "settling",
    "parking",
    "parked",
    "handed_over",
    "ended",
    "refused",
]
"""Where an activation is in its life:

- ``claiming``: a resume's claim runs (its budget check, then its Task admitted with the
  child's claim and the message in its turn), or a parked Task's continuation's (its
  budget check, then that Task claimed for this runtime), off the supervisor's mailbox:
  messages sent now are held until its result is in; a resume's Task has no id yet;
- ``admitted``: its Task exists and the activation began (loading, framing, waiting for
  a slot, starting its run); a ``recovered`` or ``continued`` one goes on in a turn its
  Task opened earlier (``ActivationPlan.kind`` and ``recovery`` say which);
- ``published``: its run is live here and takes steers;
- ``settling``: its run's result is in (or it is stopping); it takes no more messages;
- ``parking``: its run is parking on an approval request: messages sent now are held and
  go into the parked Task's continued turn once it has parked;
- ``parked``: its run ended waiting on an approval answer: the Task goes on in the
  store, ``input_required``, and its answer (or a message) continues it in any runtime;
- ``handed_over``: `close()` stopped its run mid-turn (or its provider is elsewhere):
  the Task stays in the store, its turn open, for a runtime with its provider;
- ``ended``: its Task settled here;
- ``refused``: its claim was refused: no Task was started (or continued here).

The last four are final; the supervisor then drops the record.
"""

FINAL: Final = frozenset({"parked", "handed_over", "ended", "refused"})


# -- events: what happened ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """The claim committed: a resume's Task exists, the child claimed for it and the
    message in its turn, or a parked Task is claimed for this runtime (``plan``: the
    claimed activation's plan)."""

    plan: ActivationPlan


@dataclass(frozen=True, slots=True)
class ClaimFailed:
    """The claim was refused (``error``): nothing was started. A `ParkedTask` names the
    parked Task a resume's messages go on in."""

    error: SubagentControlError


@dataclass(frozen=True, slots=True)
class RunPublished:
    """The activation published its run: durable, live, taking steers."""

    run: SubagentRun
    transcript: ActivationTranscript


@dataclass(frozen=True, slots=True)
class RunSettling:
    """The run's result is in; ``status`` is the outcome it gives (None: stopping without
    one, its turn left open). ``input_required``: it parked on an approval request."""

    status: TaskStatus | None


@dataclass(frozen=True, slots=True)
class Parking:
    """The supervisor found the run parking before its report came (its transcript took
    the park, or the store has its Task parked)."""


@dataclass(frozen=True, slots=True)
class MessageHeld:
    """A message came while the run parks: held until the Task's next step is known."""

    held: Held


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The activation ended: its Task settled (``ended``), parked on an approval request
    (``parked``), or was left open for another runtime (``handed_over``)."""

    how: Literal["ended", "parked", "handed_over"]


@dataclass(frozen=True, slots=True)
class Broke:
    """The supervisor's own code failed while this activation was current: it is aborted
    and its messages refused; the supervisor retires once it ended."""

    why: str


ActivationEvent = (
    Claimed | ClaimFailed | RunPublished | RunSettling | Parking | MessageHeld | RunEnded | Broke
)

# -- effects: what the supervisor does next -------------------------------------------------

Effect = Literal[
    "open_inbox",  # held messages' senders deliver them into the run now
    "hold",  # keep the message for the Task's next step (answered `held`)
    "hand_back",  # the parked run's messages (untaken and held) go on into its continuation
    "redecide",  # it ended without parking: what it held is decided afresh
    "close_inbox",  # refuse whatever is still queued or held
    "notify_ledger",  # the Task ledger follows the new view (`TaskService.on_view`)
    "drop",  # forget the record (the supervisor goes idle, or retires)
    "make_inbox",  # the claimed Task's inbox, for the messages that steer its turn
    "release_held",  # claimed: what it held is decided afresh (steered into its turn)
    "refuse_claim",  # the resuming sender hears the claim's refusal
    "refuse_held",  # what it held is refused as the claim was (the child is not stored)
    "continue_parked",  # the resuming message, then those held, go on in the parked Task
]

_ENDS: Final[dict[str, tuple[Effect, ...]]] = {
    "ended": ("redecide", "close_inbox", "drop", "notify_ledger"),
    "handed_over": ("redecide", "close_inbox", "drop", "notify_ledger"),
    "parked": ("hand_back", "close_inbox", "drop", "notify_ledger"),
}

_TABLE: Final[dict[tuple[str, str], tuple[str, tuple[Effect, ...]]]] = {
    ("claiming", "MessageHeld"): ("claiming", ("hold",)),
    ("claiming", "Claimed"): ("admitted", ("make_inbox", "release_held")),
    ("claiming", "ClaimFailed"): ("refused", ("refuse_claim", "redecide", "close_inbox", "drop")),
    ("claiming", "ClaimFailed:parked"): ("refused", ("continue_parked", "close_inbox", "drop")),
    ("claiming", "ClaimFailed:child_not_found"): (
        "refused",
        ("refuse_claim", "refuse_held", "close_inbox", "drop"),
    ),
    ("admitted", "RunPublished"): ("published", ("open_inbox",)),
    ("admitted", "RunSettling"): ("settling", ()),
    ("admitted", "RunEnded:ended"): ("ended", _ENDS["ended"]),
    ("published", "RunSettling"): ("settling", ()),
    ("published", "RunSettling:input_required"): ("parking", ("notify_ledger",)),
    ("published", "Parking"): ("parking", ("notify_ledger",)),
    ("published", "RunEnded:ended"): ("ended", _ENDS["ended"]),
    ("settling", "MessageHeld"): ("settling", ("hold",)),
    ("settling", "RunEnded:ended"): ("ended", _ENDS["ended"]),
    ("settling", "RunEnded:handed_over"): ("handed_over", _ENDS["handed_over"]),
    ("parking", "RunSettling"): ("parking", ()),
    ("parking", "RunSettling:input_required"): ("parking", ()),
    ("parking", "Parking"): ("parking", ()),
    ("parking", "MessageHeld"): ("parking", ("hold",)),
    ("parking", "RunEnded:parked"): ("parked", _ENDS["parked"]),
    ("parking", "RunEnded:ended"): ("ended", _ENDS["ended"]),
    ("parking", "RunEnded:handed_over"): ("handed_over", _ENDS["handed_over"]),
    **{
        (phase, "Broke"): (phase, ("close_inbox",))
        for phase in ("claiming", "admitted", "published", "settling", "parking")
    },
}
"""Every legal transition: ``(phase, event) -> (next phase, effects)``. An event's key is
its class name, with what it says where that decides the move (``RunSettling`` with
``input_required``, ``RunEnded`` with how it ended, ``ClaimFailed`` with a parked Task or
a child the store does not have)."""


def _key(event: ActivationEvent) -> str:
    if isinstance(event, ClaimFailed):
        if isinstance(event.error, ParkedTask):
            return "ClaimFailed:parked"
        if event.error.code is ErrorCode.CHILD_NOT_FOUND:
            return "ClaimFailed:child_not_found"
    if isinstance(event, RunSettling) and event.status is TaskStatus.INPUT_REQUIRED:
        return "RunSettling:input_required"
    if isinstance(event, RunEnded):
        return f"RunEnded:{event.how}"
    return type(event).__name__


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
    """Past publication: the run's result is in (or it parks or stops); it takes no more
    messages."""
    cancel_reason: str | None
    started: float
    """When it was admitted (monotonic seconds)."""
    run: SubagentRun | None = field(default=None, compare=False, repr=False)
    """Its run, once published (its inbox delivers into it)."""
    transcript: ActivationTranscript | None = field(default=None, compare=False, repr=False)
    """Its run's transcript writer, once published (its inbox steers through it)."""
    inbox: ActivationInbox | None = field(default=None, compare=False, repr=False)
    """Its inbox, where a sender may put a steer itself (`ActivationInbox.put_direct`)."""

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
    """The record of one running activation; changed by `apply` on its supervisor's
    thread only."""

    plan: ActivationPlan
    inbox: ActivationInbox
    # Agents registered after this mark may be the provider's child agent being created.
    agent_mark: int
    started: float = field(default_factory=time.monotonic)
    ref: pykka.ActorRef[Any] | None = None  # the activation actor, once it began
    slot: ActivationSlot | None = None  # where its view is published
    phase: ActivationPhase = "admitted"
    run: SubagentRun | None = None
    transcript: ActivationTranscript | None = None
    # The outcome its run's result gives, once it is in (None before, or with none).
    result: TaskStatus | None = None
    # Why its supervisor's own code failed, once it has: its messages are refused.
    broken: str | None = None
    # Messages held while its run parks (or its claim runs), in arrival order: delivered
    # once it has parked (or the claim's result is in).
    held: list[Held] = field(default_factory=list)
    # A resume's (or a continuation's) claim, run by its activation (phase ``claiming``
    # until its result is in).
    claim: ResumeClaim | None = None

    def apply(self, event: ActivationEvent) -> tuple[Effect, ...]:
        """Take ``event`` (on the supervisor's thread): move to the phase the table says,
        publish the new view, and return the effects for the supervisor to run. An event
        the table does not allow in this phase is logged and ignored (no effect)."""
        move = _TABLE.get((self.phase, _key(event)))
        if move is None:
            log.error(
                "activation %s: %s is not allowed in phase %s; ignored",
                self.task_id,
                type(event).__name__,
                self.phase,
            )
            return ()
        phase, effects = move
        if isinstance(event, Claimed):
            self.plan = event.plan
        elif isinstance(event, RunPublished):
            self.run, self.transcript = event.run, event.transcript
        elif isinstance(event, RunSettling):
            self.result = event.status or self.result
        elif isinstance(event, MessageHeld):
            self.held.append(event.held)
        elif isinstance(event, Broke):
            self.broken = self.broken or event.why
        self.phase = phase  # type: ignore[assignment]  # the table's phases are phases
        self.publish_view()
        return effects

    @property
    def takes_messages(self) -> bool:
        """Whether a message may still go into this activation's turn (or wait for its
        publication)."""
        return self.phase in ("admitted", "published") and self.broken is None

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

    @property
    def status(self) -> TaskStatus:
        """Its Task's status as this activation knows it: ``running`` until its run's
        result is in, then the outcome that result gives."""
        if self.phase == "parked" or self.phase == "parking":
            return TaskStatus.INPUT_REQUIRED
        return self.result or TaskStatus.RUNNING

    def view(self) -> ActivationView:
        """A fresh snapshot, not published."""
        return view_of(
            self.plan,
            self.phase,
            status=self.status,
            published=self.run is not None,
            started=self.started,
            run=self.run,
            transcript=self.transcript,
            inbox=self.inbox,
        )

    def publish_view(self) -> ActivationView:
        """Publish a fresh snapshot (after a change, on the supervisor's thread)."""
        view = self.view()
        if self.slot is not None:
            self.slot.view = view
        return view


def view_of(
    plan: ActivationPlan,
    phase: ActivationPhase,
    *,
    status: TaskStatus = TaskStatus.RUNNING,
    published: bool = False,
    started: float | None = None,
    run: SubagentRun | None = None,
    transcript: ActivationTranscript | None = None,
    inbox: ActivationInbox | None = None,
) -> ActivationView:
    """The view of the activation of ``plan`` in ``phase`` (`Activation.publish_view`; the
    last word of one whose supervisor is gone)."""
    return ActivationView(
        task_id=plan.task_id,
        child_id=plan.child_id,
        kind=plan.kind,
        owner_session=plan.parent.session_id,
        fence=plan.fence,
        status=status,
        published=published,
        settling=phase not in ("claiming", "admitted", "published"),
        phase=phase,
        recovery=plan.recovery,
        cancel_reason=plan.signal.reason,
        started=time.monotonic() if started is None else started,
        run=run,
        transcript=transcript,
        inbox=inbox,
    )
