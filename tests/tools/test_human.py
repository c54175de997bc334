"""Human input: a person's message goes through send_message under the live parent."""

from __future__ import annotations

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControlError,
    TaskStatus,
)
from controlplane.tools import HumanInput

from .conftest import PARENT, PARENT_MODEL, WAIT_S, MakeRig, Rig


@pytest.fixture
def url(store_url: str) -> str:
    """Transcripts and sources involve the store: run on SQLite and PostgreSQL."""
    return store_url


def inbound(events: list[SessionEvent], text: str) -> list[SessionEvent]:
    """The inbound message events (prompt or steering) carrying ``text``."""
    return [
        event
        for event in events
        if event.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
        and text in str(event.data)
    ]


def test_a_human_and_a_coordinator_message_in_one_turn_share_its_task_and_result(
    make_rig: MakeRig,
) -> None:
    rig = make_rig(["first reply", "final answer"], gated=True)
    started = rig.start()
    assert rig.model.wait_for_calls(1, WAIT_S)

    by_parent = rig.ok("send_message", {"subagent_id": started.child_id, "message": "from X"})
    by_human = HumanInput(rig.control, rig.parent).send(
        started.child_id, "from a human", sender_id="alice"
    )
    rig.model.release(2)
    snapshot = rig.settle(started.task_id)

    assert by_parent == f"message delivered to running task {started.task_id}"
    assert by_human.route == "steered"
    assert by_human.task_id == started.task_id
    assert [task.id for task in rig.control.tasks.list(rig.parent)] == [started.task_id]
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "final answer"
    # The answer that settled the Task came from a call that had both messages.
    last_call = rig.model.calls[-1]
    seen = [message.text for message in last_call.messages]
    assert "from X" in seen
    assert "from a human" in seen
    events = rig.events(started.child_id)
    (coordinator,) = inbound(events, "from X")
    (human,) = inbound(events, "from a human")
    assert coordinator.kind == human.kind == EventKind.STEERING_MESSAGE
    assert coordinator.source is not None
    assert (coordinator.source.kind, coordinator.source.sender_session_id) == (
        "coordinator",
        PARENT,
    )
    assert human.source is not None
    assert (human.source.kind, human.source.sender_session_id) == ("human", "alice")


def test_a_human_and_a_coordinator_message_in_one_turn_share_its_kill(gated: Rig) -> None:
    started = gated.start()
    assert gated.model.wait_for_calls(1, WAIT_S)
    gated.ok("send_message", {"subagent_id": started.child_id, "message": "from X"})
    by_human = HumanInput(gated.control, PARENT).send(started.child_id, "from a human")

    gated.ok("task_kill", {"task_id": by_human.task_id})
    snapshot = gated.settle(started.task_id)

    assert by_human.task_id == started.task_id
    assert snapshot.status is TaskStatus.KILLED
    assert len(gated.control.tasks.list(gated.parent)) == 1
    events = gated.events(started.child_id)
    assert len(inbound(events, "from X")) == 1
    assert len(inbound(events, "from a human")) == 1


def test_a_human_message_to_an_idle_child_starts_a_task_the_parent_owns(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)

    result = HumanInput(rig.control, rig.parent).send(
        started.child_id, "please continue", sender_id="alice"
    )
    snapshot = rig.settle(result.task_id)

    assert result.route == "started"
    assert snapshot.owner_session == PARENT
    assert snapshot.status is TaskStatus.COMPLETED
    (message,) = inbound(rig.events(started.child_id), "please continue")
    assert message.source is not None
    assert (message.source.kind, message.source.sender_session_id) == ("human", "alice")


def test_human_input_without_a_live_parent_is_unauthorized_and_delivers_nothing(
    rig: Rig,
) -> None:
    started = rig.start()
    rig.settle(started.task_id)
    human = HumanInput(rig.control, rig.parent)
    rig.parent.dispose()
    before = len(rig.events(started.child_id))

    with pytest.raises(SubagentControlError) as raised:
        human.send(started.child_id, "anyone there?")

    assert raised.value.code is ErrorCode.UNAUTHORIZED
    assert len(rig.events(started.child_id)) == before
    assert len(rig.control.tasks.list(PARENT)) == 1


def test_human_input_follows_the_parent_when_its_session_is_loaded_again(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)
    human = HumanInput(rig.control, rig.parent)
    rig.parent.dispose()
    reloaded = rig.control.agents.register(PARENT, model=PARENT_MODEL)

    result = human.send(started.child_id, "back again")

    assert result.route == "started"
    assert rig.control.tasks.get(result.task_id, requester=reloaded).owner_session == PARENT
    rig.settle(result.task_id)


def test_human_input_refuses_text_that_is_not_a_string(rig: Rig) -> None:
    started = rig.start()

    with pytest.raises(SubagentControlError) as raised:
        HumanInput(rig.control, rig.parent).send(started.child_id, 42)  # type: ignore[arg-type]

    assert raised.value.code is ErrorCode.INVALID_INPUT
