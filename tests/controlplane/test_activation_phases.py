"""The activation record's state machine (actors._record): one transition function,
`Activation.apply(event) -> effects`, run on the supervisor's thread, with an explicit table
of every legal ``(phase, event) -> (phase, effects)``; an event the table does not allow is
logged and ignored, never a silent change."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import pytest

import actors._record
from actors._inbox import ActivationInbox, Held
from actors._record import (
    _TABLE,
    Activation,
    ActivationEvent,
    ActivationSlot,
    Broke,
    Claimed,
    ClaimFailed,
    MessageHeld,
    Parking,
    RunEnded,
    RunPublished,
    RunSettling,
)
from actors._transcript import ActivationTranscript
from actors.messages import ActivationPlan, ResumeClaim, SendMessage
from controlplane import (
    CancelSignal,
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import (
    NO_TRACE,
    AgentHandle,
    AgentRegistry,
    ParkedTask,
    SubagentControlError,
    SubagentRun,
    text_of,
)
from controlplane.telemetry import Telemetry
from persistence import SqlStore

_PARENT = AgentHandle(AgentRegistry(), "p", model=None, depth=0)
_SOURCE = MessageSource(kind="coordinator", sender_session_id="p")


def _activation(recovery: int = 0) -> Activation:
    signal = CancelSignal()
    plan = ActivationPlan(
        kind="continued" if recovery else "resumed",
        task_id="t1",
        child_id="c1",
        parent=_PARENT,
        prompt=(TextBlock(text="x"),),
        source=_SOURCE,
        signal=signal,
        label="x",
        recovery=recovery,
    )
    inbox = ActivationInbox(
        "c1", "t1", signal=signal, trace=NO_TRACE, telemetry=Telemetry("test-runtime")
    )
    return Activation(plan=plan, inbox=inbox, agent_mark=0, slot=ActivationSlot())


def _claiming() -> Activation:
    """A resume's record while its claim runs."""
    record = _activation()
    record.phase = "claiming"
    send = SendMessage(parent=_PARENT, message=(TextBlock(text="m"),), source=_SOURCE)
    record.claim = ResumeClaim(send)
    return record


def _claimed() -> Claimed:
    # A plan of its own (no inbox listens to its signal): kept in the parameters below.
    plan = _activation().plan.model_copy(update={"signal": CancelSignal()})
    return Claimed(plan.model_copy(update={"task_id": "t2", "fence": 3}))


def _published() -> RunPublished:
    return RunPublished(run=object(), transcript=object())  # type: ignore[arg-type]


def _held() -> MessageHeld:
    send = SendMessage(parent=_PARENT, message=(TextBlock(text="m"),), source=_SOURCE)
    return MessageHeld(Held(send))


_END = ("redecide", "close_inbox", "drop", "notify_ledger")
_PARKED = ("hand_back", "close_inbox", "drop", "notify_ledger")


LEGAL = [
    # A run that completes (or fails) after its publication.
    (
        [_published(), RunSettling(TaskStatus.COMPLETED), RunEnded("ended")],
        ["published", "settling", "ended"],
        [("open_inbox",), (), _END],
    ),
    # A start that fails before publication.
    ([RunEnded("ended")], ["ended"], [_END]),
    # A crash after publication (no settling report).
    ([_published(), RunEnded("ended")], ["published", "ended"], [("open_inbox",), _END]),
    # A resume whose provider is elsewhere: left, before publication.
    ([RunSettling(None), RunEnded("handed_over")], ["settling", "handed_over"], [(), _END]),
    # A run stopped by close mid-turn, handed over.
    (
        [_published(), RunSettling(None), RunEnded("handed_over")],
        ["published", "settling", "handed_over"],
        [("open_inbox",), (), _END],
    ),
    # A run that parks on an approval request, with a message held meanwhile.
    (
        [_published(), RunSettling(TaskStatus.INPUT_REQUIRED), _held(), RunEnded("parked")],
        ["published", "parking", "parking", "parked"],
        [("open_inbox",), ("notify_ledger",), ("hold",), _PARKED],
    ),
    # The supervisor sees the park first (its transcript took it), then the report comes.
    (
        [_published(), Parking(), RunSettling(TaskStatus.INPUT_REQUIRED), RunEnded("parked")],
        ["published", "parking", "parking", "parked"],
        [("open_inbox",), ("notify_ledger",), (), _PARKED],
    ),
    # A parking run that settles after all (its park failed late): what it held is
    # decided afresh.
    (
        [_published(), Parking(), RunSettling(TaskStatus.INTERRUPTED), RunEnded("ended")],
        ["published", "parking", "parking", "ended"],
        [("open_inbox",), ("notify_ledger",), (), _END],
    ),
    # An approval answer's continuation that comes while the run ends: held, then
    # decided afresh.
    (
        [_published(), RunSettling(TaskStatus.INTERRUPTED), _held(), RunEnded("ended")],
        ["published", "settling", "settling", "ended"],
        [("open_inbox",), (), ("hold",), _END],
    ),
    # The supervisor's own failure: messages refused, the phase kept until the run ends.
    ([Broke("bug"), RunEnded("ended")], ["admitted", "ended"], [("close_inbox",), _END]),
]


@pytest.mark.parametrize(("events", "phases", "effects"), LEGAL)
def test_every_legal_transition_moves_to_its_phase_with_its_effects(
    events: list[ActivationEvent], phases: list[str], effects: list[tuple[str, ...]]
) -> None:
    record = _activation()
    for event, phase, effect in zip(events, phases, effects, strict=True):
        assert record.apply(event) == effect, (event, record.phase)
        assert record.phase == phase
        assert record.publish_view().phase == phase  # the published view follows


def _documented_table() -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    """The transition table as `actors._record`'s docstring draws it: its ``*`` row for
    every phase the line above the table names, ``(same)`` for the phase itself."""
    doc = actors._record.__doc__ or ""
    lines = doc.splitlines()
    rules = [n for n, line in enumerate(lines) if line.startswith("=====")]
    assert len(rules) == 3, "the docstring's table: a header and one body"
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[rules[0]])]
    spans[-1] = (spans[-1][0], 1000)  # the last column runs to the line's end
    above = "\n".join(lines[: rules[0]]).rsplit("(``*``:", 1)[1]
    anywhere = re.findall(r"``(\w+)``", above)
    table: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
    for line in lines[rules[1] + 1 : rules[2]]:
        phase, event, after, effects = (line[a:b].strip() for a, b in spans)
        moves = tuple(e.strip() for e in effects.split(",") if e.strip())
        for start in anywhere if phase == "``*``" else [phase]:
            assert (start, event) not in table, f"{(start, event)} drawn twice"
            table[start, event] = (start if after == "(same)" else after, moves)
    return table


def test_the_docstring_draws_the_transition_table_the_code_runs() -> None:
    assert _documented_table() == _TABLE


ILLEGAL = [
    ([], RunEnded("parked")),  # never published: it cannot have parked
    ([], RunEnded("handed_over")),  # not from admitted: it never ran here
    ([], _held()),  # nothing parks before publication
    ([_published()], _published()),  # published once
    ([_published()], RunEnded("parked")),  # a park is reported first
    ([_published(), Parking()], _published()),
    ([_published(), RunSettling(TaskStatus.COMPLETED)], RunEnded("parked")),
    ([RunEnded("ended")], _published()),  # final
    ([RunEnded("ended")], RunEnded("ended")),  # final, even when repeated
    ([_published(), Parking(), RunEnded("parked")], _held()),  # final
]


_REFUSED = ("refuse_claim", "redecide", "close_inbox", "drop")


CLAIMING = [
    # A claim that commits, a message held meanwhile: decided afresh into its turn.
    (
        [_held(), _claimed(), _published()],
        ["claiming", "admitted", "published"],
        [("hold",), ("make_inbox", "release_held"), ("open_inbox",)],
    ),
    # A claim refused (a budget reached, the child held elsewhere): nothing started.
    (
        [_held(), ClaimFailed(SubagentControlError(ErrorCode.BUDGET_EXHAUSTED, "spent"))],
        ["claiming", "refused"],
        [("hold",), _REFUSED],
    ),
    # The child's Task is parked: its messages go on in that Task.
    (
        [ClaimFailed(ParkedTask(child_id="c1", task_id="t0"))],
        ["refused"],
        [("continue_parked", "close_inbox", "drop")],
    ),
    # The child is not in the store: what it held is refused as the claim was.
    (
        [ClaimFailed(SubagentControlError(ErrorCode.CHILD_NOT_FOUND, "no child"))],
        ["refused"],
        [("refuse_claim", "refuse_held", "close_inbox", "drop")],
    ),
    # The supervisor's own failure while the claim runs: the claim's result still comes.
    ([Broke("bug"), _claimed()], ["claiming", "admitted"], [("close_inbox",), None]),
    # A parked Task's continuation, through the same rows: another runtime continues the
    # Task (or, with no provider here, its message went into the parked turn in the store,
    # its sender answered): what it held is decided afresh.
    (
        [_held(), ClaimFailed(SubagentControlError(ErrorCode.NOT_DELIVERED, "taken"))],
        ["claiming", "refused"],
        [("hold",), _REFUSED],
    ),
]


@pytest.mark.parametrize(("events", "phases", "effects"), CLAIMING)
def test_a_resume_claims_off_the_mailbox_then_goes_on_as_its_result_says(
    events: list[ActivationEvent], phases: list[str], effects: list[tuple[str, ...] | None]
) -> None:
    record = _claiming()
    assert (record.publish_view().state, record.takes_messages) == ("starting", False)
    for event, phase, effect in zip(events, phases, effects, strict=True):
        applied = record.apply(event)
        assert effect is None or applied == effect, (event, record.phase)
        assert record.phase == phase
    if isinstance(events[-1], (Claimed, RunPublished)):
        assert (record.task_id, record.view().fence) == ("t2", 3)  # the claim named it


@pytest.mark.parametrize(
    "event",
    [_published(), RunSettling(None), RunEnded("ended"), Parking()],
    ids=lambda event: type(event).__name__,
)
def test_nothing_but_its_claims_result_moves_a_claiming_record(
    event: ActivationEvent, caplog: pytest.LogCaptureFixture
) -> None:
    record = _claiming()
    with caplog.at_level(logging.ERROR, logger="actors._record"):
        assert record.apply(event) == ()
    assert record.phase == "claiming"


@pytest.mark.parametrize(("before", "event"), ILLEGAL)
def test_an_illegal_event_is_logged_and_changes_nothing(
    before: list[ActivationEvent], event: ActivationEvent, caplog: pytest.LogCaptureFixture
) -> None:
    record = _activation()
    for earlier in before:
        record.apply(earlier)
    phase, view, held = record.phase, record.publish_view(), list(record.held)
    with caplog.at_level(logging.ERROR, logger="actors._record"):
        assert record.apply(event) == ()
    assert (record.phase, record.held) == (phase, held)
    assert record.publish_view() == view
    assert "is not allowed in phase" in caplog.text


def test_the_view_says_where_the_record_is_and_its_recovery() -> None:
    record = _activation(recovery=2)
    view = record.publish_view()
    assert (view.phase, view.recovery, view.state) == ("admitted", 2, "starting")
    record.apply(_published())
    assert (record.publish_view().state, record.takes_messages) == ("running", True)
    record.apply(RunSettling(TaskStatus.INPUT_REQUIRED))
    view = record.publish_view()
    assert (view.phase, view.settling, view.status) == ("parking", True, TaskStatus.INPUT_REQUIRED)
    assert not record.takes_messages


class _Store:
    """Stands in for the store's appends (each returns at once)."""

    def append(self, _child_id: str, _events: Sequence[NewEvent], **_options: Any) -> list[Any]:
        return []

    def abandoning(self, _abandoned: Callable[[], bool]) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def abandon_waits(self, _thread_ids: Collection[int]) -> None:
        """No append waits."""


class _Run:
    child_id = "c1"
    local_agent = None

    def __init__(self) -> None:
        self.steered: list[str] = []

    def steer(self, message: Sequence[TextBlock], _source: MessageSource) -> None:
        self.steered.append(text_of(message))


def _send(text: str) -> SendMessage:
    return SendMessage(parent=_PARENT, message=(TextBlock(text=text),), source=_SOURCE)


def test_the_inbox_delivers_by_the_view_its_supervisor_hands_it() -> None:
    # The inbox keeps no status of its own: before the published view, a message waits;
    # with it, the message goes into the view's run; once the view's transcript parked,
    # messages wait for the supervisor to take them back with the parked view.
    activation = _activation()
    inbox = activation.inbox
    early = inbox.put(_send("early"))
    assert inbox.pending == 1

    run = _Run()
    transcript = ActivationTranscript(cast(SqlStore, _Store()), "c1", turn=1, task_id="t1")
    transcript.publish([NewEvent(kind=EventKind.TURN_START, turn=1, data={})])
    assert activation.apply(RunPublished(cast(SubagentRun, run), transcript)) == ("open_inbox",)
    inbox.publish(activation.view())
    assert inbox.wait(early) is None  # delivered and recorded, on this (the sender's) thread
    assert run.steered == ["early"]

    assert transcript.park_with(lambda: True)
    late = inbox.put(_send("late"))
    activation.apply(Parking())
    assert activation.apply(RunEnded("parked"))[0] == "hand_back"
    held = inbox.hand_back(activation.view())
    assert [h.send.message[0].text for h in held] == ["late"]
    assert inbox.wait(late) is held[0]  # its answer comes from the parked Task's next turn
    assert run.steered == ["early"]


def _published_inbox(agents: AgentRegistry) -> tuple[Activation, _Run]:
    """A record whose run is published, its inbox open to direct puts."""
    activation = _activation()
    activation.inbox = ActivationInbox(
        "c1",
        "t1",
        signal=activation.signal,
        trace=NO_TRACE,
        telemetry=Telemetry("test-runtime"),
        agents=agents,
    )
    run = _Run()
    transcript = ActivationTranscript(cast(SqlStore, _Store()), "c1", turn=1, task_id="t1")
    transcript.publish([NewEvent(kind=EventKind.TURN_START, turn=1, data={})])
    activation.apply(RunPublished(cast(SubagentRun, run), transcript))
    activation.inbox.publish(activation.view())
    return activation, run


def test_a_sender_puts_its_steer_into_the_published_run_itself_until_the_supervisor_moves_on() -> (
    None
):
    # A direct put is taken only where the supervisor would have steered the message; every
    # other case is left to the supervisor (None), which decides as always.
    agents = AgentRegistry()
    before = _activation()
    assert before.inbox.put_direct(_send("early")) is None  # not published yet: it holds it

    activation, run = _published_inbox(agents)
    inbox = activation.inbox
    direct = inbox.put_direct(_send("direct"))
    assert direct is not None
    assert inbox.wait(direct) is None  # delivered and recorded on the sender's thread
    assert run.steered == ["direct"]

    stranger = AgentHandle(AgentRegistry(), "q", model=None, depth=0)
    foreign = SendMessage(parent=stranger, message=(TextBlock(text="x"),), source=_SOURCE)
    assert inbox.put_direct(foreign) is None  # another session's Task: TASK_NOT_FOUND there

    activation.apply(RunSettling(TaskStatus.COMPLETED))
    inbox.stop_direct()  # what the supervisor does before any step's effects
    assert inbox.put_direct(_send("late")) is None
    assert inbox.pending == 0
    assert run.steered == ["direct"]


@pytest.mark.parametrize("why", ["killed", "squatter", "closed", "parked"])
def test_a_direct_put_is_left_to_the_supervisor_whenever_it_would_not_steer(why: str) -> None:
    agents = AgentRegistry()
    activation, run = _published_inbox(agents)
    inbox = activation.inbox
    if why == "killed":
        activation.signal.abort("killed by a test")
    elif why == "squatter":
        agents.register("c1")  # a live agent on the child's id that is not the run's
    elif why == "closed":
        inbox.close(ErrorCode.NOT_DELIVERED, "it ended")
    else:
        transcript = activation.transcript
        assert transcript is not None
        assert transcript.park_with(lambda: True)
    assert inbox.put_direct(_send("m")) is None
    assert inbox.pending == 0
    assert run.steered == []
