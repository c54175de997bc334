"""What an activation's turn is made of before its provider is called
(`actors.activation.ActivationActor`): a new child's seed, frame and header, or a resumed
child loaded, checked and folded into its request, with the run's transcript, spend gate
and approval desk; and the control flow the turn's steps end it with (`Settle`,
`Elsewhere`, `HandOver`). Apart from the turn because a resume's load is the longest
step, and the one that reads the store's transcript as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors._activation_part import ActivationPart
from actors._outcomes import failed
from actors._record import ActivationView
from actors._spend import TurnSpend
from actors._transcript import ActivationTranscript, message_data, turn_frame
from controlplane.contract import (
    ApprovalDesk,
    Budget,
    ChildMeta,
    Descriptor,
    ErrorCode,
    EventKind,
    LoadedSession,
    NewEvent,
    ResumeRequest,
    SessionEvent,
    StartRequest,
    SubagentControlError,
    SubagentProvider,
    TaskOutcome,
    TurnGate,
    fold_descriptor,
    utcnow,
)

__all__ = ["Elsewhere", "HandOver", "Prepared", "Settle", "TurnPreparation"]


class Settle(Exception):
    """Ends the activation early with ``outcome`` (internal control flow)."""

    def __init__(self, outcome: TaskOutcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


class Elsewhere(Exception):
    """The resumed turn's provider is not in this runtime: its Task is left for one that
    has it (internal control flow); ``refusal`` is the outcome if it cannot be."""

    def __init__(self, provider: str, refusal: TaskOutcome) -> None:
        super().__init__(provider)
        self.provider = provider
        self.refusal = refusal


class HandOver(Exception):
    """`close` stopped a resumed turn before its run was published: the turn is handed
    over, its Task left ``running`` (internal control flow)."""


@dataclass(slots=True)
class Prepared:
    provider: SubagentProvider
    request: StartRequest | ResumeRequest
    transcript: ActivationTranscript
    frame: list[NewEvent]
    header: ChildMeta | None
    gate: TurnGate | None


class TurnPreparation(ActivationPart):
    """The preparing half of `actors.activation.ActivationActor`, which holds the state
    named here (set in its ``__init__``)."""

    _loaded: bool
    _view: ActivationView

    def _prepare(self) -> Prepared:
        plan = self._plan
        if plan.kind == "initial":
            return self._prepare_initial()
        return self._prepare_resumed(continued=plan.kind == "continued")

    def _prepare_initial(self) -> Prepared:
        plan = self._plan
        assert plan.descriptor is not None
        assert plan.depth is not None
        squatter = self._ctx.agents.get(plan.child_id)
        if squatter is not None:
            raise Settle(failed(_conflict(plan.child_id), ErrorCode.OWNERSHIP_CONFLICT))
        provider = self._provider(plan.descriptor)
        transcript = self._transcript(turn=1, descriptor=plan.descriptor)
        gate = self._gate(plan.descriptor.budget, transcript)
        now = utcnow()
        seed = [
            SessionEvent(seq=i, turn=0, kind=e.kind, data=e.data, source=e.source, created_at=now)
            for i, e in enumerate(plan.seed, start=1)
        ]
        frame = [
            *(NewEvent(kind=e.kind, turn=0, data=e.data, source=e.source) for e in plan.seed),
            *self._frame(transcript),
            NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data=plan.descriptor.to_event_data()),
        ]
        header = ChildMeta(
            child_id=plan.child_id,
            parent_session=plan.parent.session_id,
            depth=plan.depth,
            seed_length=len(seed),
            label=plan.label,
            created_at=plan.created_at,
        )
        request = StartRequest(
            child_id=plan.child_id,
            prompt=list(plan.prompt),
            source=plan.source,
            parent=plan.parent,
            descriptor=plan.descriptor,
            depth=plan.depth,
            transcript=transcript,
            seed=seed,
            gate=gate,
            approvals=self._desk(transcript, plan.descriptor.provider),
            trace=plan.trace,
        )
        return Prepared(provider, request, transcript, frame, header, gate)

    def _prepare_resumed(self, *, continued: bool) -> Prepared:
        plan = self._plan
        child = plan.child_id
        try:
            with plan.trace.loading():
                loaded = self._ctx.store.load(child)
        except SubagentControlError as exc:
            raise Settle(
                failed(f"child {child} is unavailable: {exc.message}", ErrorCode.NOT_RESUMABLE)
            ) from exc
        self._loaded = True
        if loaded.meta.parent_session != plan.parent.session_id:
            raise Settle(
                failed(
                    f"child {child} belongs to another parent session; only its direct parent "
                    "can continue it",
                    ErrorCode.UNAUTHORIZED,
                )
            )
        last_turn, descriptors = _resume_facts(loaded)
        descriptor = fold_descriptor(descriptors)
        if descriptor is None:
            raise Settle(
                failed(
                    f"child {child} has no supported descriptor, so it cannot be re-created; "
                    "do not retry",
                    ErrorCode.NOT_RESUMABLE,
                )
            )
        earlier = loaded.own_events
        framed = _own_open_turn(earlier, last_turn, plan.task_id)
        if (
            not continued
            and framed is not None
            and plan.fence is not None
            and descriptor.provider not in self._ctx.providers.names()
        ):
            # Its message is in its turn already (the claim wrote it): a runtime with the
            # provider runs it, rather than a refusal here.
            try:
                self._provider(descriptor)
            except Settle as refusal:
                raise Elsewhere(descriptor.provider, refusal.outcome) from None
        provider = self._provider(descriptor)
        open_turn: list[SessionEvent] = []
        if continued:
            if framed is None:
                raise Settle(
                    failed(f"task {plan.task_id} has no open turn of child {child} to go on in")
                )
            # Parked on an approval request: it goes on in its own open turn, whose
            # events the run reads (its prompt among them), writing no frame.
            earlier, open_turn = earlier[:framed], earlier[framed:]
            last_turn -= 1
        elif framed is not None:
            # This Task wrote its frame before it waited for a slot, and its runtime died:
            # adopted here, it goes on in that turn (its message is in it once).
            earlier, last_turn = earlier[:framed], last_turn - 1
        transcript = self._transcript(turn=last_turn + 1, descriptor=descriptor, earlier=open_turn)
        gate = self._gate(descriptor.budget, transcript)
        # Not validated again: every value is ours and typed, and validating would visit each
        # of a long transcript's events once more (an isinstance each, cold in cache).
        request = ResumeRequest.model_construct(
            child_id=child,
            prompt=list(plan.prompt),
            source=plan.source,
            parent=plan.parent,
            descriptor=descriptor,
            depth=loaded.meta.depth,
            transcript=transcript,
            seed=loaded.seed,
            events=earlier,
            open_turn=open_turn,
            gate=gate,
            approvals=self._desk(transcript, descriptor.provider),
            trace=plan.trace,
        )
        if continued:
            frame = self._steered(transcript)
        else:
            frame = [] if framed is not None else self._frame(transcript)
        return Prepared(provider, request, transcript, frame, None, gate)

    def _steered(self, transcript: ActivationTranscript) -> list[NewEvent]:
        """A continued turn's frame: the message sent to the parked child, if any, as a
        ``steering/message`` of its open turn (read before the model goes on)."""
        plan = self._plan
        if not plan.prompt:
            return []
        event = NewEvent(
            kind=EventKind.STEERING_MESSAGE,
            turn=transcript.turn,
            data=message_data(plan.prompt),
            source=plan.source,
        )
        return [event]

    def _desk(self, transcript: ActivationTranscript, provider: str) -> ApprovalDesk | None:
        """Where the run asks for approvals, or None without a store for them."""
        approvals = self._ctx.approvals
        if approvals is None:
            return None
        signal = self._plan.signal
        return approvals.desk(self._view, provider=provider, signal=signal, transcript=transcript)

    def _gate(self, own: Budget | None, transcript: ActivationTranscript) -> TurnGate | None:
        """The run's spend gate, or None when the control plane has no budgets."""
        budgets = self._ctx.budgets
        if budgets is None:
            return None
        plan = self._plan
        return _FencedGate(
            budgets.gate(
                self._view,
                label=plan.label,
                own=own,
                held=transcript.held_spend,
                fenced=transcript.fenced_read,
            ),
            transcript,
        )

    def _transcript(
        self, *, turn: int, descriptor: Descriptor, earlier: Sequence[SessionEvent] = ()
    ) -> ActivationTranscript:
        plan = self._plan
        fence = None if plan.fence is None else (self._ctx.runtime_id, plan.fence)
        spend = TurnSpend(turn, price=self._ctx.prices.for_descriptor(descriptor), trace=plan.trace)
        spend.earlier(earlier)  # a continued turn's spend so far: the Task's is the whole turn's
        self._ctx.tasks.meter(plan.task_id, lambda: spend.total)
        return ActivationTranscript(
            self._ctx.store,
            plan.child_id,
            turn=turn,
            fence=fence,
            task_id=plan.task_id,
            signal=plan.signal,
            spend=spend,
        )

    def _frame(self, transcript: ActivationTranscript) -> list[NewEvent]:
        plan = self._plan
        return turn_frame(
            transcript.turn,
            task_id=plan.task_id,
            kind=plan.kind,
            label=plan.label,
            prompt=plan.prompt,
            source=plan.source,
        )

    def _provider(self, descriptor: Descriptor) -> SubagentProvider:
        self._plan.trace.describe(descriptor)
        try:
            return self._ctx.providers.get(descriptor.provider)
        except SubagentControlError as exc:
            raise Settle(failed(exc.message, exc.code)) from exc


def _resume_facts(loaded: LoadedSession) -> tuple[int, list[SessionEvent]]:
    """The child's highest turn, and its own descriptor events (those after its seed).

    The store's decoder notes both while it builds the events (`SqlStore.load` returns
    them in a list that carries them, ``noted()``): found afterwards, each is a walk over
    every event, cold in cache right after a long load (at 14,000 events the two walks took
    about a tenth as long as the load). Events that do not carry them are walked.
    """
    events = loaded.events
    noted = getattr(events, "noted", None)
    facts = noted() if callable(noted) else None
    if facts is None:
        return loaded.last_turn, loaded.own_events
    last_turn, indexes = facts
    seed = loaded.meta.seed_length
    return last_turn, [events[i] for i in indexes if i >= seed]


def _own_open_turn(events: Sequence[SessionEvent], last_turn: int, task_id: str) -> int | None:
    """Where the child's last turn begins, when it is still open and was opened by
    ``task_id`` (its frame written before a wait its runtime did not live through); None
    otherwise. Reads only the last turn: a closed one ends with its ``turn/end``."""
    if not events or events[-1].kind == EventKind.TURN_END or events[-1].turn != last_turn:
        return None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.turn != last_turn:
            return None
        if event.kind == EventKind.TURN_START:
            data = event.data
            owned = isinstance(data, dict) and data.get("task_id") == task_id
            return index if owned else None
    return None


def _conflict(child_id: str) -> str:
    return (
        f"a live agent already uses the id of child {child_id}; it is never adopted, so the "
        "child cannot run while it lives"
    )


class _FencedGate:
    """A run's spend gate whose store calls are abandoned when the runtime fences the
    activation, as its transcript's writes are (a read on a silent network held the
    activation past the fence, and its Task's `wait`): the gate runs each of them inside
    the transcript's `fenced_read`. A check refuses at once once the activation is fenced;
    one answered from the rows the run's own appends left makes no store call, and is not
    wrapped (each wrap registers the thread for the fence to find, under a lock).
    """

    __slots__ = ("_gate", "_transcript")

    def __init__(self, gate: TurnGate, transcript: ActivationTranscript) -> None:
        self._gate = gate
        self._transcript = transcript

    def check(self, call: str) -> None:
        self._transcript.refuse_if_fenced()
        self._gate.check(call)

    @property
    def exhausted(self) -> str | None:
        return self._gate.exhausted

    def elapsed_s(self) -> float:
        return self._gate.elapsed_s()

    def ended(self) -> None:
        self._transcript.refuse_if_fenced()
        self._gate.ended()
