"""The built-in providers behind the real control plane, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    EventKind,
    ForkProvider,
    InProcessProvider,
    MessageSource,
    ModelSelector,
    NewEvent,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from controlplane.models import (
    ChatMessage,
    ModelReply,
)

from .conftest import loop_threads
from .fakes import UNREPORTED

WAIT_S = 5.0
PARENT_MODEL = ModelSelector(provider="acme", model="m1")
COORDINATOR = MessageSource(kind="coordinator", sender_session_id="parent-1")

OpenControl = Callable[..., SubagentControl]


@pytest.fixture
def open_control(store_url: str) -> Iterator[OpenControl]:
    """Open control planes on the test's store with the given models (closed after the test)."""
    opened: list[SubagentControl] = []

    def open_(model: ScriptedModel, *, fork: ScriptedModel | None = None) -> SubagentControl:
        control = SubagentControl.open(store_url)
        opened.append(control)
        control.providers.register(InProcessProvider(model))
        control.providers.register(ForkProvider(fork or model))
        return control

    yield open_
    for control in opened:
        control.close()


def register_parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("parent-1", model=PARENT_MODEL)


def start(
    control: SubagentControl, parent: AgentHandle, prompt: str = "research X", **fields: Any
) -> ContinuableStart:
    spec = ContinuableStartSpec(
        provider=fields.pop("provider", "inprocess"),
        label="research",
        prompt=[TextBlock(text=prompt)],
        parent=parent,
        **fields,
    )
    return control.start_continuable(spec)


def settle(control: SubagentControl, task_id: str, parent: AgentHandle) -> TaskSnapshot:
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert snapshot.status.is_terminal
    return snapshot


def stored(control: SubagentControl, child_id: str) -> list[SessionEvent]:
    assert control.store is not None
    return control.store.load(child_id).events


def chat(events: list[SessionEvent]) -> list[tuple[int, str, str]]:
    """(turn, kind, text) of the message events, frames and descriptors left out."""
    return [
        (e.turn, e.kind, e.data["text"])
        for e in events
        if e.kind
        in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE, EventKind.ASSISTANT_MESSAGE)
    ]


def test_a_started_child_completes_with_its_reply_and_its_transcript_in_order(
    open_control: OpenControl,
) -> None:
    model = ScriptedModel(["three facts"])
    control = open_control(model)
    parent = register_parent(control)
    started = start(control, parent, persona="researcher")
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "three facts"
    assert model.calls[0].system == "researcher"
    assert model.calls[0].model == PARENT_MODEL
    events = stored(control, started.child_id)
    assert [e.kind for e in events] == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.DESCRIPTOR,
        EventKind.ASSISTANT_MESSAGE,
        EventKind.TURN_END,
    ]
    assert events[3].data == {"text": "three facts", "steering_seen": 0, **UNREPORTED}
    assert events[3].source is None
    # Settled: the durable child stays, its live agent and loop thread are gone.
    assert control.agents.get(started.child_id) is None
    assert loop_threads() == []


def steered_during_the_first_call(
    open_control: OpenControl, replies: list[str]
) -> tuple[ScriptedModel, SubagentControl, AgentHandle, ContinuableStart]:
    """A child whose first model call (gated) was running when "focus on B" was steered."""
    model = ScriptedModel(replies, gated=True)
    control = open_control(model)
    parent = register_parent(control)
    started = start(control, parent)
    assert model.wait_for_calls(1, WAIT_S)
    sent = control.send_message(parent, started.child_id, [TextBlock(text="focus on B")])
    assert sent.route == "steered"
    assert sent.task_id == started.task_id
    return model, control, parent, started


def test_a_message_steered_mid_turn_is_recorded_before_the_reply_it_causes(
    open_control: OpenControl,
) -> None:
    model, control, parent, started = steered_during_the_first_call(
        open_control, ["first", "second"]
    )
    model.release(2)
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "second"
    assert chat(stored(control, started.child_id)) == [
        (1, EventKind.USER_MESSAGE, "research X"),
        (1, EventKind.STEERING_MESSAGE, "focus on B"),
        (1, EventKind.ASSISTANT_MESSAGE, "first"),
        (1, EventKind.ASSISTANT_MESSAGE, "second"),
    ]
    assert model.calls[1].messages[-1] == ChatMessage(
        role="user", text="focus on B", source=COORDINATOR
    )


def test_a_child_resumed_after_a_steer_mid_call_sees_the_conversation_its_live_model_saw(
    open_control: OpenControl,
) -> None:
    # The steer lands while the model writes "first": it is committed before that reply,
    # but the live model read it only at its next call, after "first".
    model, control, parent, started = steered_during_the_first_call(
        open_control, ["first", "second", "third"]
    )
    model.release(2)
    settle(control, started.task_id, parent)
    live = model.calls[1].messages
    assert [(m.role, m.text) for m in live] == [
        ("user", "research X"),
        ("assistant", "first"),
        ("user", "focus on B"),
    ]

    resumed = control.send_message(parent, started.child_id, [TextBlock(text="and then?")])
    assert resumed.route == "started"
    model.release()
    settle(control, resumed.task_id, parent)

    assert model.calls[2].messages == [
        *live,
        ChatMessage(role="assistant", text="second"),
        ChatMessage(role="user", text="and then?", source=COORDINATOR),
    ]


def test_a_follow_up_after_the_turn_resumes_the_child_with_its_persona_and_history(
    open_control: OpenControl,
) -> None:
    model = ScriptedModel(["answer one", "answer two"])
    control = open_control(model)
    parent = register_parent(control)
    started = start(control, parent, persona="auditor", agent_provider="vendor", agent_model="big")
    settle(control, started.task_id, parent)
    sent = control.send_message(parent, started.child_id, [TextBlock(text="and then?")])
    assert sent.route == "started"
    snapshot = settle(control, sent.task_id, parent)
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "answer two"
    resumed = model.calls[1]
    assert resumed.system == "auditor"
    assert resumed.model == ModelSelector(provider="vendor", model="big")
    assert [(m.role, m.text) for m in resumed.messages] == [
        ("user", "research X"),
        ("assistant", "answer one"),
        ("user", "and then?"),
    ]
    assert chat(stored(control, started.child_id))[-2:] == [
        (2, EventKind.USER_MESSAGE, "and then?"),
        (2, EventKind.ASSISTANT_MESSAGE, "answer two"),
    ]


def test_a_child_resumed_after_a_restart_gets_its_persona_and_history_back(
    open_control: OpenControl,
) -> None:
    first = ScriptedModel(["before the restart"])
    control = open_control(first)
    parent = register_parent(control)
    started = start(control, parent, persona="archivist")
    settle(control, started.task_id, parent)
    control.close()

    second = ScriptedModel(["after the restart"])
    control = open_control(second)
    parent = register_parent(control)
    sent = control.send_message(parent, started.child_id, [TextBlock(text="still there?")])
    assert sent.route == "started"
    snapshot = settle(control, sent.task_id, parent)
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "after the restart"
    (call,) = second.calls
    assert call.system == "archivist"
    assert [m.text for m in call.messages] == [
        "research X",
        "before the restart",
        "still there?",
    ]


def test_a_forked_child_starts_from_its_seed_and_is_not_re_forked_on_resume(
    open_control: OpenControl,
) -> None:
    model = ScriptedModel(["forked one", "forked two"])
    control = open_control(model)
    parent = register_parent(control)
    seed = [
        NewEvent(kind=EventKind.USER_MESSAGE, turn=0, data={"text": "parent task"}),
        NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=0, data={"text": "parent plan"}),
    ]
    started = start(control, parent, "try option B", provider="fork", seed_events=seed)
    settle(control, started.task_id, parent)
    assert [m.text for m in model.calls[0].messages] == [
        "parent task",
        "parent plan",
        "try option B",
    ]
    sent = control.send_message(parent, started.child_id, [TextBlock(text="and C?")])
    settle(control, sent.task_id, parent)
    assert [m.text for m in model.calls[1].messages] == [
        "parent task",
        "parent plan",
        "try option B",
        "forked one",
        "and C?",
    ]
    assert control.store is not None
    loaded = control.store.load(started.child_id)
    assert loaded.meta.seed_length == 2
    assert [e.data["text"] for e in loaded.seed] == ["parent task", "parent plan"]


def test_killing_a_child_mid_call_records_killed_and_no_reply(open_control: OpenControl) -> None:
    model = ScriptedModel(["never written"], gated=True)
    control = open_control(model)
    parent = register_parent(control)
    started = start(control, parent)
    # A steer returns only once the run is published (and the child durable).
    sent = control.send_message(parent, started.child_id, [TextBlock(text="hurry")])
    assert sent.route == "steered"
    assert model.wait_for_calls(1, WAIT_S)
    control.tasks.kill(started.task_id, requester=parent)
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    kinds = [e.kind for e in stored(control, started.child_id)]
    assert EventKind.STEERING_MESSAGE in kinds
    assert EventKind.ASSISTANT_MESSAGE not in kinds
    assert control.agents.get(started.child_id) is None
    assert loop_threads() == []


def test_closing_the_control_plane_stops_a_child_stuck_in_a_model_call(
    open_control: OpenControl,
) -> None:
    model = ScriptedModel(["never"], gated=True)
    control = open_control(model)
    parent = register_parent(control)
    started = start(control, parent)
    assert model.wait_for_calls(1, WAIT_S)
    control.close()
    assert loop_threads() == []
    assert control.agents.get(started.child_id) is None


def test_a_model_error_fails_the_task_with_its_text(open_control: OpenControl) -> None:
    control = open_control(ScriptedModel([RuntimeError("model overloaded")]))
    parent = register_parent(control)
    started = start(control, parent)
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert "model overloaded" in (snapshot.outcome.detail or "")


def test_a_truncated_turn_fails_with_its_stop_reason(open_control: OpenControl) -> None:
    control = open_control(ScriptedModel([ModelReply(text="cut", stop_reason="max-tokens")]))
    parent = register_parent(control)
    started = start(control, parent)
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.detail == "max-tokens"


def test_every_follow_up_killed_at_once_is_in_the_transcript_in_a_turn_closed_by_its_outcome(
    open_control: OpenControl,
) -> None:
    # A kill right after `started` lands anywhere: in the load, before the provider call,
    # while the loop starts, mid-turn. Wherever it lands, the message was accepted, so it is
    # in its Task's turn, and the turn ends with the Task's status (SPEC §5 send_message 4).
    control = open_control(ScriptedModel(echo=True))
    parent = register_parent(control)
    started = start(control, parent)
    settle(control, started.task_id, parent)
    outcomes = {}
    for n in range(40):
        sent = control.send_message(parent, started.child_id, [TextBlock(text=f"follow-up {n}")])
        assert sent.route == "started"
        control.tasks.kill(sent.task_id, requester=parent)
        outcomes[sent.task_id] = (f"follow-up {n}", settle(control, sent.task_id, parent).status)

    turns: dict[int, list[SessionEvent]] = {}
    for event in stored(control, started.child_id):
        turns.setdefault(event.turn, []).append(event)
    by_task = {t[0].data["task_id"]: t for t in turns.values() if t[0].turn > 1}
    assert set(by_task) == set(outcomes)
    for task_id, (message, status) in outcomes.items():
        turn = by_task[task_id]
        assert [e.kind for e in turn[:2]] == [EventKind.TURN_START, EventKind.USER_MESSAGE]
        assert turn[1].data == {"text": message}
        assert turn[1].source == COORDINATOR
        assert turn[-1].kind == EventKind.TURN_END
        assert turn[-1].data == {"task_id": task_id, "status": status.value}
    assert TaskStatus.KILLED in {status for _, status in outcomes.values()}
