"""SPEC §5 send_message 3: the resume route for a child with no activation."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ChildMeta,
    Descriptor,
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    SubagentControl,
    TaskStatus,
)
from tests.fakes import FakeProvider, completed
from tests.support import (
    WAIT_S,
    MakeControl,
    carrying,
    events,
    failed_outcome,
    kinds,
    raises,
    settle,
    start_child,
    supervised,
    task_ids,
    text,
)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def idle_child(control: SubagentControl, parent: AgentHandle, **fields: Any) -> str:
    started = start_child(control, parent, **fields)
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    return started.child_id


def stored_child(
    control: SubagentControl, parent: AgentHandle, descriptors: list[dict[str, object]]
) -> str:
    """A child written straight to the store, with these descriptor events in turn 1."""
    assert control.store is not None
    child_id = str(uuid.uuid4())
    control.store.create_child(
        ChildMeta(child_id=child_id, parent_session=parent.session_id, depth=1)
    )
    control.store.append(
        child_id,
        [NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data=data) for data in descriptors],
    )
    return child_id


def test_a_follow_up_to_an_idle_child_starts_a_new_task_owned_by_the_parent(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    first_task = task_ids(control, parent)[0]
    provider.plan(result=completed("resumed answer"))

    result = control.send_message(parent, child_id, text("carry on"))

    assert result.route == "started"
    assert result.task_id != first_task
    snapshot = settle(control, result.task_id, parent)
    assert (snapshot.owner_session, snapshot.kind, snapshot.child_id) == (
        parent.session_id,
        "subagent",
        child_id,
    )
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "resumed answer"
    assert task_ids(control, parent) == [first_task, result.task_id]
    (request,) = provider.resumes
    assert request.child_id == child_id
    assert [block.text for block in request.prompt] == ["carry on"]
    assert request.source == MessageSource(kind="coordinator", sender_session_id=parent.session_id)
    assert request.depth == 1


def test_a_resumed_activation_is_the_next_turn_and_gets_the_earlier_turns_events(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent, prompt="first prompt")
    turn_1 = events(control, child_id)

    result = control.send_message(
        parent, child_id, text("second prompt"), MessageSource(kind="human")
    )
    settle(control, result.task_id, parent)

    (request,) = provider.resumes
    assert request.events == turn_1
    assert request.transcript.turn == 2
    stored = events(control, child_id)
    turn_2 = [event for event in stored if event.turn == 2]
    assert stored[: len(turn_1)] == turn_1
    assert kinds(turn_2)[0] == EventKind.TURN_START
    assert kinds(turn_2)[-1] == EventKind.TURN_END
    (prompt,) = carrying(stored, "second prompt")
    assert (prompt.kind, prompt.turn, prompt.source) == (
        EventKind.USER_MESSAGE,
        2,
        MessageSource(kind="human"),
    )


@pytest.mark.parametrize(
    ("message", "label"),
    [
        ("check the  logs\n\tagain ", "check the logs again"),
        ("", "subagent follow-up"),
        (" \n\t ", "subagent follow-up"),
        ("x" * 80, "x" * 80),
        ("y" * 81, "y" * 79 + "…"),
        ("word " * 40, ("word " * 16)[:79] + "…"),
    ],
    ids=["collapsed", "empty", "blank", "80-chars", "81-chars", "long-words"],
)
def test_a_follow_up_task_label_is_derived_from_the_message(
    control: SubagentControl, parent: AgentHandle, message: str, label: str
) -> None:
    child_id = idle_child(control, parent)

    result = control.send_message(parent, child_id, text(message))

    assert control.tasks.get(result.task_id, requester=parent).label == label
    settle(control, result.task_id, parent)


def test_send_returns_started_at_once_without_waiting_for_the_provider(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    gate = threading.Event()
    plan = provider.plan(start_gate=gate)

    result = control.send_message(parent, child_id, text("carry on"))

    assert result.route == "started"
    assert not plan.returned.is_set()
    assert control.tasks.get(result.task_id, requester=parent).status is TaskStatus.RUNNING
    gate.set()
    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED


def test_a_send_to_an_id_that_is_no_child_is_refused_at_once_and_starts_nothing(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    unknown = str(uuid.uuid4())

    with raises(ErrorCode.CHILD_NOT_FOUND, match="no task was started"):
        control.send_message(parent, unknown, text("anyone?"))

    # One answer, at once, as the tool handlers give: no Task (in memory or in the store),
    # no child, no supervisor left holding a thread for the id.
    assert control.tasks.list(parent) == []
    assert control.store is not None
    assert control.store.list_children(parent.session_id) == []
    assert unknown not in supervised(control)
    assert provider.resumes == []


def test_a_foreign_parent_fails_unauthorized_another_parent_session(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
) -> None:
    child_id = idle_child(control, parent)
    before = events(control, child_id)

    result = control.send_message(stranger, child_id, text("I am your parent now"))

    assert result.route == "started"
    snapshot = settle(control, result.task_id, stranger)
    assert snapshot.owner_session == stranger.session_id
    outcome = failed_outcome(snapshot)
    assert outcome.code is ErrorCode.UNAUTHORIZED
    assert "another parent session" in (outcome.detail or "")
    assert provider.resumes == []
    assert events(control, child_id) == before


def test_a_child_with_no_supported_descriptor_fails_not_resumable_do_not_retry(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = stored_child(control, parent, [{"version": 2, "provider": "fake"}])

    result = control.send_message(parent, child_id, text("wake up"))

    snapshot = settle(control, result.task_id, parent)
    outcome = failed_outcome(snapshot)
    assert outcome.code is ErrorCode.NOT_RESUMABLE
    assert "do not retry" in (outcome.detail or "")
    assert provider.resumes == []


def test_resume_folds_the_newest_supported_descriptor(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = stored_child(
        control,
        parent,
        [
            {"version": 1, "provider": "fake", "persona": "old"},
            {"version": 1, "provider": "fake", "persona": "new", "inputs": {"k": [1]}},
            {"version": 7, "provider": "fake", "persona": "from the future"},
        ],
    )

    result = control.send_message(parent, child_id, text("wake up"))

    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
    (request,) = provider.resumes
    assert request.descriptor == Descriptor(provider="fake", persona="new", inputs={"k": [1]})


def test_a_descriptor_in_the_seed_does_not_make_a_child_resumable(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    assert control.store is not None
    child_id = str(uuid.uuid4())
    control.store.create_child(
        ChildMeta(child_id=child_id, parent_session=parent.session_id, depth=1, seed_length=1),
        [NewEvent(kind=EventKind.DESCRIPTOR, turn=0, data={"version": 1, "provider": "fake"})],
    )

    result = control.send_message(parent, child_id, text("wake up"))

    snapshot = settle(control, result.task_id, parent)
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.NOT_RESUMABLE
    assert provider.resumes == []


def test_kill_while_the_resume_is_starting_rolls_back_and_records_killed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    plan = provider.plan(start_gate=threading.Event())
    result = control.send_message(parent, child_id, text("carry on"))
    assert plan.entered.wait(WAIT_S)

    control.tasks.kill(result.task_id, requester=parent)

    snapshot = settle(control, result.task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    assert plan.rolled_back.is_set()
    assert provider.total_live() == 0
    # `started` was answered: the message is in the transcript, in a turn closed `killed`.
    turn_2 = [e for e in events(control, child_id) if e.turn == 2]
    assert kinds(turn_2) == [EventKind.TURN_START, EventKind.USER_MESSAGE, EventKind.TURN_END]
    assert turn_2[1].data == {"text": "carry on"}
    assert turn_2[1].source == MessageSource(kind="coordinator", sender_session_id="parent-1")
    assert turn_2[2].data == {"task_id": result.task_id, "status": "killed"}


def test_a_resume_whose_provider_fails_to_start_keeps_its_message_in_a_closed_turn(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    provider.plan(fail_start=RuntimeError("the agent would not start"), writes=[("x/y", {})])
    result = control.send_message(parent, child_id, text("carry on"))

    snapshot = settle(control, result.task_id, parent)

    assert snapshot.status is TaskStatus.FAILED
    turn_2 = [e for e in events(control, child_id) if e.turn == 2]
    # Its provider's writes during the failed start are dropped; the message is not.
    assert kinds(turn_2) == [EventKind.TURN_START, EventKind.USER_MESSAGE, EventKind.TURN_END]
    assert turn_2[1].data == {"text": "carry on"}
    assert turn_2[2].data == {"task_id": result.task_id, "status": "failed"}


def test_a_kill_right_after_a_follow_up_never_leaves_a_provider_run_behind(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    # The recheck after the load cannot be hit on purpose through the public API, so try
    # many times: a killed Task means the provider was never called, rolled back, or its
    # run was disposed before the outcome.
    child_id = idle_child(control, parent)
    outcomes: list[tuple[str, str]] = []
    control.tasks.on_done(lambda snapshot: outcomes.append(("outcome", snapshot.id)))
    for _ in range(60):
        calls_before = len(provider.plans)
        result = control.send_message(parent, child_id, text("carry on"))
        control.tasks.kill(result.task_id, requester=parent)
        snapshot = settle(control, result.task_id, parent)

        assert snapshot.status in (TaskStatus.KILLED, TaskStatus.COMPLETED)
        assert provider.total_live() == 0
        calls = provider.plans[calls_before:]
        assert len(calls) <= 1
        if snapshot.status is TaskStatus.KILLED and calls:
            (plan,) = calls
            assert plan.rolled_back.is_set() or plan.disposed.is_set()
    assert len(outcomes) == 60


def test_each_activation_is_one_turn_and_turns_grow_by_one(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    for i in range(3):
        result = control.send_message(parent, child_id, text(f"follow-up {i}"))
        assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED

    stored = events(control, child_id)
    assert [e.turn for e in stored] == sorted(e.turn for e in stored)
    assert [e.turn for e in stored if e.kind == EventKind.TURN_START] == [1, 2, 3, 4]
    assert [e.turn for e in stored if e.kind == EventKind.TURN_END] == [1, 2, 3, 4]
    assert [request.transcript.turn for request in provider.resumes] == [2, 3, 4]
    for i in range(3):
        (prompt,) = carrying(stored, f"follow-up {i}")
        assert prompt.turn == i + 2


def test_a_resume_gets_the_childs_own_events_without_its_seed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    assert control.store is not None
    child_id = str(uuid.uuid4())
    seed = NewEvent(kind=EventKind.USER_MESSAGE, turn=0, data={"text": "parent history"})
    own = NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data={"version": 1, "provider": "fake"})
    control.store.create_child(
        ChildMeta(child_id=child_id, parent_session=parent.session_id, depth=1, seed_length=1),
        [seed, own],
    )

    result = control.send_message(parent, child_id, text("continue"))

    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
    (request,) = provider.resumes
    assert [(e.kind, e.data) for e in request.events] == [(own.kind, own.data)]
    assert [(e.kind, e.data) for e in request.seed] == [(seed.kind, seed.data)]


def test_a_child_is_continued_by_a_new_control_plane_after_a_restart(
    make_control: MakeControl, url: str, provider: FakeProvider
) -> None:
    before = make_control()
    parent = before.agents.register("parent-1")
    started = start_child(before, parent, persona="careful", inputs={"topic": "X"})
    settle(before, started.task_id, parent)
    turn_1 = events(before, started.child_id)
    before.close()

    after = make_control(url)
    same_parent = after.agents.register("parent-1")
    result = after.send_message(same_parent, started.child_id, text("welcome back"))

    assert result.route == "started"
    assert settle(after, result.task_id, same_parent).status is TaskStatus.COMPLETED
    (request,) = provider.resumes
    assert request.descriptor == provider.starts[0].descriptor
    assert request.descriptor.persona == "careful"
    assert request.events == turn_1
    assert request.parent is same_parent
    assert [view.child_id for view in after.children(same_parent)] == [started.child_id]
