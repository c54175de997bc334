"""Messages that cross actor boundaries. All frozen; none carries ORM rows or sessions."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import pykka
from pydantic import BaseModel, ConfigDict, Field

from actors._inbox import ActivationInbox, Delivery, Held
from actors._transcript import ActivationTranscript
from controlplane.contract import (
    NO_TRACE,
    ActivationTrace,
    AgentHandle,
    CancelSignal,
    Descriptor,
    MessageSource,
    NewEvent,
    Origin,
    SendResult,
    SubagentControlError,
    SubagentRun,
    SupervisorNode,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
    utcnow,
)

__all__ = [
    "ActivationEnded",
    "ActivationPlan",
    "BeginActivation",
    "ClaimCommitted",
    "ClaimRefused",
    "Describe",
    "DescribeAll",
    "FrameReceipt",
    "PassivateIfIdle",
    "Published",
    "Reply",
    "ResumeClaim",
    "RouteSend",
    "Routed",
    "SendMessage",
    "Settling",
    "Shutdown",
    "SpawnChild",
    "StopAccepting",
    "Sweep",
]

_MESSAGE = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class FrameReceipt:
    """A message carried into a continued turn (sent to a child parked on an
    approval request): resolved once its activation has written it into the turn, or
    with the reason it could not. Its sender is answered ``steered`` only then."""

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: SubagentControlError | None = None

    def resolve(self, error: SubagentControlError | None) -> None:
        """Written (None), or not, with why; the first resolution stands."""
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def wait(self) -> None:
        """Return once the message is written.

        Raises:
            SubagentControlError: it was not (``NOT_DELIVERED``, ``DURABILITY_FAILED``…).
        """
        self._done.wait()
        if self._error is not None:
            raise self._error


class ActivationPlan(BaseModel):
    """Everything an activation actor needs to run one turn of a child."""

    model_config = _MESSAGE

    # ``continued``: a Task parked on an approval request goes on in its own open turn
    # (its answer came, it was killed, or a message was sent to it).
    kind: Literal["initial", "resumed", "continued"]
    task_id: str
    child_id: str
    parent: AgentHandle
    prompt: tuple[TextBlock, ...]
    source: MessageSource
    signal: CancelSignal
    label: str
    # Initial activations only: the snapshot taken by start_continuable.
    descriptor: Descriptor | None = None
    depth: int | None = None
    seed: tuple[NewEvent, ...] = ()
    # When the child was started: its header's created_at, so children list in start order.
    created_at: datetime = Field(default_factory=utcnow)
    # Its span, metrics and timings, from admission to settlement.
    # A factory, not a default: pydantic before 2.8 deep-copies a plain default (and a
    # trace holds a lock).
    trace: ActivationTrace = Field(default_factory=lambda: NO_TRACE)
    # The fencing number of this runtime's claim on the child (an initial start claims
    # number 1 with the header); None for a resume of a child the store does not have.
    fence: int | None = 1
    # A continued turn's message (a steer to a parked child), resolved once it is written.
    receipt: FrameReceipt | None = None
    # A recovered turn: how many times its Task has been taken over
    # from a runtime that ended mid-turn (this activation's included); 0 for any other.
    recovery: int = 0


class SendMessage(BaseModel):
    """Supervisor: steer the running activation or resume the child. Replies `Reply`, or
    raises the refusal (a coded `SubagentControlError`); `pykka.ActorDeadError` when the
    supervisor retired or stopped before handling it (then sending it again to the child's
    next supervisor cannot duplicate it)."""

    model_config = _MESSAGE

    parent: AgentHandle
    message: tuple[TextBlock, ...]
    source: MessageSource
    # Where the send came from (its trace context, when it began): a resume it starts
    # continues that trace and times its latency from there.
    origin: Origin | None = None
    # The inbox id of a message forwarded from another runtime: it only ever
    # steers the running activation, never starts a resume here (the sender may resume the
    # child itself once this runtime has let it go), and its steering record carries the
    # id, so the sender can tell whether it was delivered even if this runtime dies.
    forwarded: str | None = None
    # The Task parked on an approval request to continue here (its answer came), with no
    # message: answered ``started`` with that Task's id.
    continues: str | None = None
    # A running Task taken over from a dead (or closed) runtime: the
    # child is already claimed here for it (``continues`` names it): its stored snapshot,
    # the claim's fencing number and its recovery count. Answered ``started``.
    recovered: tuple[TaskSnapshot, int, int] | None = None

    @classmethod
    def checked(
        cls,
        parent: AgentHandle,
        message: tuple[TextBlock, ...],
        source: MessageSource,
        origin: Origin | None = None,
    ) -> SendMessage:
        """A send of ``message`` built from values its caller checked already (the
        facade's send checks, `controlplane.runtime._validate`), without validating them
        again: on a steer's path pydantic's check cost more than the rest of the
        building. The same model as the constructor's, field for field."""
        send = _new_object(cls)
        _set_dict(
            send,
            {
                "parent": parent,
                "message": message,
                "source": source,
                "origin": origin,
                "forwarded": None,
                "continues": None,
                "recovered": None,
            },
        )
        _set_fields_set(send, set(_CHECKED_FIELDS))
        _set_extra(send, None)
        _set_private(send, None)
        return send


_CHECKED_FIELDS: Final = frozenset({"parent", "message", "source", "origin"})
_new_object = object.__new__
# The slots pydantic keeps on every model, set through their descriptors (as
# `model_construct` does, without its loop over the fields).
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


class ResumeClaim:
    """A resume's claim, run off its supervisor's mailbox by the activation it starts: the
    budget check, then the new Task admitted with the child's claim and the message in its
    turn, in one transaction (`actors.activation.ActivationActor`). With ``parked`` (a
    parked Task's id) it is that Task's continuation's claim instead: the budget check
    (unless ``checked``: it passed one just now), then the parked Task claimed for this
    runtime, its message going into the continued turn.

    ``held`` is the resuming sender's answer: the activation resolves it ``started`` once
    the claim committed (the message durable), after `claimed` (the claimed Task's plan).
    The supervisor learns of the commit with no message of its own when it can: a message
    it would hold finds the claim committed (`holding`), and so does the activation's
    first report; only if it held messages while the claim ran is it told at once
    (`ClaimCommitted`). A refused claim goes to the supervisor (`ClaimRefused`), which
    answers the sender."""

    __slots__ = ("_holds", "_lock", "checked", "held", "parked", "plan", "send")

    def __init__(
        self, send: SendMessage, *, parked: str | None = None, checked: bool = False
    ) -> None:
        self.send = send
        self.parked = parked
        self.checked = checked
        self.held = Held(send)
        self.plan: ActivationPlan | None = None
        self._lock = threading.Lock()
        self._holds = False  # the supervisor held a message while the claim ran

    def claimed(self, plan: ActivationPlan) -> bool:
        """The claim committed as ``plan`` (the activation's side): whether the supervisor
        holds messages for it, and so is to be told now."""
        with self._lock:
            self.plan = plan
            return self._holds

    def holding(self) -> ActivationPlan | None:
        """The supervisor is about to hold a message: the claimed plan if the claim
        committed already (the message is decided now instead), else None (held; the
        activation tells the supervisor once it commits)."""
        with self._lock:
            if self.plan is None:
                self._holds = True
            return self.plan


class ClaimCommitted(BaseModel):
    """Supervisor (from the activation): the claim (a resume's or a continuation's)
    committed while the supervisor held messages for it; they go into the claimed turn
    now."""

    model_config = _MESSAGE

    claim: ResumeClaim


class ClaimRefused(BaseModel):
    """Supervisor (from the activation, an ask): the claim (a resume's or a continuation's)
    was refused, nothing was started (``error``; a `ParkedTask` names the Task its message
    goes on in). Replies whether it took the claim's sender over (False: the activation
    answers it itself)."""

    model_config = _MESSAGE

    claim: ResumeClaim
    error: SubagentControlError


class SpawnChild(BaseModel):
    """Root: create the supervisor of a new child with its initial activation."""

    model_config = _MESSAGE

    plan: ActivationPlan


class BeginActivation(BaseModel):
    """Supervisor: start the actor of the initial activation it was created with.

    From the root once the new child is routed: an activation that failed at once could
    retire its supervisor, and the retirement must find the route it removes. (A resume's
    activation is started by the supervisor as it answers ``started``, with no message.)
    """

    model_config = _MESSAGE


class RouteSend(BaseModel):
    """Root: hand ``send`` to the supervisor of ``child_id``, created idle if this process
    has none. Replies `Routed` at once, without waiting for the supervisor's answer.

    The caller takes this path only when it found no route: the message then reaches the
    new supervisor straight from the root, not after a round trip back through the caller.
    """

    model_config = _MESSAGE

    child_id: str
    send: SendMessage


class Sweep(BaseModel):
    """Root (from the passivator): offer every supervisor to retire if it has been idle for
    ``idle_for_s`` seconds. Nothing is waited for."""

    model_config = _MESSAGE

    idle_for_s: float


class PassivateIfIdle(BaseModel):
    """Supervisor: retire if no activation has run, and no message came, for
    ``idle_for_s`` seconds. A later message finds no route and makes a new supervisor."""

    model_config = _MESSAGE

    idle_for_s: float


class StopAccepting(BaseModel):
    """Root: refuse to create supervisors from now on (close has begun)."""

    model_config = _MESSAGE


class Shutdown(BaseModel):
    """Root: stop every supervisor (close, after settlement)."""

    model_config = _MESSAGE

    timeout_s: float


class DescribeAll(BaseModel):
    """Root: describe every supervisor, not waiting past ``timeout_s`` for any."""

    model_config = _MESSAGE

    timeout_s: float


class Published(BaseModel):
    """Supervisor (from the activation): the run is durable and live; deliver held messages."""

    model_config = _MESSAGE

    task_id: str
    run: SubagentRun
    transcript: ActivationTranscript


class Settling(BaseModel):
    """Supervisor (from the activation): the run's result is in; dispose and outcome follow.
    ``status`` is the outcome the result gives (disposal or the store may still turn it
    into ``failed`` or ``interrupted``): the record stops taking messages, saying why."""

    model_config = _MESSAGE

    task_id: str
    status: TaskStatus | None = None


class ActivationEnded(BaseModel):
    """Supervisor (from the activation): the Task has its outcome; drop the association.

    ``durable`` says whether the child exists in the store (published, or loaded);
    ``parked``, whether its run parked on an approval request.
    """

    model_config = _MESSAGE

    task_id: str
    durable: bool
    parked: bool = False
    # Its run was stopped by `close` mid-turn and its Task left running in the store for
    # another runtime to recover; ``parked`` is set too.
    handed_over: bool = False


class Describe(BaseModel):
    """Supervisor: reply with its `SupervisorNode`."""

    model_config = _MESSAGE


DescribeReply = SupervisorNode


@dataclass(frozen=True, slots=True)
class Routed:
    """The root's answer to `RouteSend`: the supervisor it handed the message to, and that
    supervisor's pending `Reply`, for the caller to read."""

    supervisor: pykka.ActorRef[Any]
    reply: pykka.Future[Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """What a supervisor answers for a `SendMessage`: the one reply type.

    ``started``: a resume began, as Task ``task_id``. ``steered``: the message was put into
    the inbox of the running activation ``task_id``; the sender completes its delivery
    (`result`) on its own thread — the supervisor never waits for the run or the store.
    ``held``: the child's run is parking, or its resume's claim runs (the message that
    resumed it: ``task_id`` empty until the claim names it); the supervisor (or, for the
    resuming message, the activation that claimed) delivers the message once the Task's
    next step is known and resolves ``held`` with that reply.
    A refusal is never a reply: it is raised through the ask's future.
    """

    route: Literal["started", "steered", "held"]
    task_id: str
    inbox: ActivationInbox | None = None
    delivery: Delivery | None = None
    receipt: FrameReceipt | None = None
    held: Held | None = None

    def result(self) -> SendResult:
        """The send's result, once it is final: for a steer, once the message's record is
        durable (delivering it, or waiting for whoever delivers it first).

        Raises:
            SubagentControlError: the steer was not delivered (``NOT_DELIVERED``, …), or
                ``DURABILITY_FAILED``: the run has it, the transcript does not.
        """
        if self.held is not None:
            return self.held.result()
        if self.inbox is not None and self.delivery is not None:
            moved = self.inbox.wait(self.delivery)
            if moved is not None:  # its run parked first: delivered on by the supervisor
                return moved.result()
            return self.inbox.steered(self.task_id)
        if self.receipt is not None:
            self.receipt.wait()
        assert self.route != "held"
        return SendResult(route=self.route, task_id=self.task_id)
