"""SPEC §5 send_message 1-2 and 4: ownership first, then the steer route."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    MessageSource,
    SendResult,
    SubagentControl,
    TaskStatus,
)
from tests.fakes import FakeProvider
from tests.support import (
    WAIT_S,
    carrying,
    events,
    eventually,
    held_messages,
    idle_child,
    in_thread,
    is_durable,
    raises,
    running_child,
    settle,
    starting_child,
    task_ids,
    text,
)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


without_live_input = pytest.mark.parametrize(
    "script",
    [{"steerable": False}, {"fail_steer": RuntimeError("no live input")}],
    ids=["no-steer", "steer-raises"],
)
"""Runs a test against both runs that cannot take a steer: none offered, or one that raises."""


@pytest.fixture
def release() -> threading.Event:
    """Opens every result gate a test closed with it."""
    return threading.Event()


def send_held(
    control: SubagentControl, parent: AgentHandle, child_id: str, message: str
) -> Future[SendResult]:
    """Send ``message`` from another thread, and wait until the supervisor holds it."""
    sending = in_thread(lambda: control.send_message(parent, child_id, text(message)))
    eventually(lambda: held_messages(control, child_id) == 1, "the message is held")
    return sending


def test_a_live_agent_under_the_child_id_is_an_ownership_conflict_for_an_idle_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    squatter = control.agents.register(child_id)

    with raises(ErrorCode.OWNERSHIP_CONFLICT):
        control.send_message(parent, child_id, text("hello"))

    assert provider.resumes == []
    assert len(task_ids(control, parent)) == 1
    assert control.agents.get(child_id) is squatter  # never adopted
    assert carrying(events(control, child_id), "hello") == []


def test_a_live_agent_under_the_child_id_is_an_ownership_conflict_for_a_running_child(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release)
    squatter = control.agents.register(child_id)

    with raises(ErrorCode.OWNERSHIP_CONFLICT):
        control.send_message(parent, child_id, text("hello"))

    assert provider.steers == []
    assert control.agents.get(child_id) is squatter
    release.set()
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    assert control.agents.get(child_id) is squatter


def test_the_current_runs_own_agent_is_not_an_ownership_conflict(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, plan = running_child(control, parent, provider, release, local_agent=True)
    assert plan.run is not None
    assert control.agents.get(child_id) is plan.run.local_agent

    result = control.send_message(parent, child_id, text("hello"))

    assert (result.route, result.task_id) == ("steered", task_id)
    release.set()
    settle(control, task_id, parent)


def test_steer_from_another_parent_is_task_not_found(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release)

    with raises(ErrorCode.TASK_NOT_FOUND):
        control.send_message(stranger, child_id, text("let me in"))

    assert provider.steers == []
    assert task_ids(control, stranger) == []
    release.set()
    settle(control, task_id, parent)
    assert carrying(events(control, child_id), "let me in") == []


def test_steered_returns_the_same_task_id_and_starts_no_second_task(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release)

    first = control.send_message(parent, child_id, text("one"))
    second = control.send_message(parent, child_id, text("two"))

    assert (first.route, first.task_id) == ("steered", task_id)
    assert (second.route, second.task_id) == ("steered", task_id)
    assert provider.steered_texts(child_id) == ["one", "two"]
    assert task_ids(control, parent) == [task_id]
    assert provider.resumes == []
    release.set()
    settle(control, task_id, parent)


def test_the_steering_message_is_in_the_transcript_with_its_source_before_send_returns(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release)
    human = MessageSource(kind="human", sender_session_id=parent.session_id)

    control.send_message(parent, child_id, text("from the coordinator"))
    control.send_message(parent, child_id, text("from a human"), human)

    # Read while the turn is still running: the commit happened before the reply.
    stored = events(control, child_id)
    (coordinator_event,) = carrying(stored, "from the coordinator")
    (human_event,) = carrying(stored, "from a human")
    assert coordinator_event.kind == human_event.kind == EventKind.STEERING_MESSAGE
    assert coordinator_event.source == MessageSource(
        kind="coordinator", sender_session_id=parent.session_id
    )
    assert human_event.source == human
    assert coordinator_event.turn == human_event.turn == 1
    assert coordinator_event.seq < human_event.seq
    steers = provider.steers
    assert [s.source for s in steers] == [coordinator_event.source, human]
    release.set()
    settle(control, task_id, parent)


def test_a_message_sent_before_publication_is_held_and_steered_only_after_delivery(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    gate = threading.Event()
    started, _ = starting_child(control, parent, provider, gate, result_gate=release)

    sending = send_held(control, parent, started.child_id, "early")
    assert not sending.done()
    assert provider.steers == []
    gate.set()
    result = sending.result(WAIT_S)

    assert (result.route, result.task_id) == ("steered", started.task_id)
    assert provider.steered_texts(started.child_id) == ["early"]
    (event,) = carrying(events(control, started.child_id), "early")
    assert event.kind == EventKind.STEERING_MESSAGE
    assert event.source == MessageSource(kind="coordinator", sender_session_id=parent.session_id)
    release.set()
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED


def test_a_held_message_is_not_delivered_when_the_activation_ends_before_publication(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    gate = threading.Event()
    started, _ = starting_child(
        control, parent, provider, gate, fail_start=RuntimeError("no capacity")
    )

    sending = send_held(control, parent, started.child_id, "early")
    gate.set()

    with raises(ErrorCode.NOT_DELIVERED):
        sending.result(WAIT_S)
    assert settle(control, started.task_id, parent).status is TaskStatus.FAILED
    assert provider.steers == []
    assert provider.resumes == []
    assert not is_durable(control, started.child_id)


def test_a_held_message_is_not_delivered_when_the_activation_is_killed_before_publication(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    started, _ = starting_child(control, parent, provider)

    sending = send_held(control, parent, started.child_id, "early")
    control.tasks.kill(started.task_id, requester=parent)

    with raises(ErrorCode.NOT_DELIVERED):
        sending.result(WAIT_S)
    assert settle(control, started.task_id, parent).status is TaskStatus.KILLED
    assert provider.steers == []
    assert provider.resumes == []


@without_live_input
def test_a_message_the_running_turn_cannot_take_is_not_delivered_and_never_resumes(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
    script: dict[str, object],
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release, **script)

    with raises(ErrorCode.NOT_DELIVERED):
        control.send_message(parent, child_id, text("can you hear me"))

    assert provider.resumes == []
    assert task_ids(control, parent) == [task_id]
    release.set()
    settle(control, task_id, parent)
    assert carrying(events(control, child_id), "can you hear me") == []


def test_a_steer_after_the_turn_settled_is_not_delivered_while_the_task_settles(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    dispose_gate = threading.Event()
    child_id, task_id, plan = running_child(
        control, parent, provider, release, dispose_gate=dispose_gate
    )
    release.set()
    assert plan.settled.wait(WAIT_S)  # result() returned; dispose is held

    with raises(ErrorCode.NOT_DELIVERED):
        control.send_message(parent, child_id, text("after the end"))

    assert provider.resumes == []
    dispose_gate.set()
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    assert task_ids(control, parent) == [task_id]
    assert carrying(events(control, child_id), "after the end") == []


def test_parent_and_human_messages_in_one_turn_share_its_task_and_its_kill(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, release)

    from_parent = control.send_message(parent, child_id, text("parent says"))
    from_human = control.send_message(
        parent, child_id, text("human says"), MessageSource(kind="human")
    )
    control.tasks.kill(task_id, requester=parent)

    assert from_parent.task_id == from_human.task_id == task_id
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    assert control.tasks.list(parent) == [snapshot]
    stored = events(control, child_id)
    assert [e.source.kind for e in carrying(stored, "says") if e.source] == ["coordinator", "human"]


def test_an_agent_squatting_the_child_id_before_publication_is_an_ownership_conflict(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    # The run this provider publishes has no agent of its own, so an agent registered
    # under the child id while the run was starting is a squatter, not the run's agent.
    gate, release = threading.Event(), threading.Event()
    started, _ = starting_child(control, parent, provider, gate, result_gate=release)
    squatter = control.agents.register(started.child_id)

    sending = in_thread(lambda: control.send_message(parent, started.child_id, text("to whom?")))
    eventually(
        lambda: sending.done() or held_messages(control, started.child_id) == 1,
        "the message is refused or held",
    )
    gate.set()

    with raises(ErrorCode.OWNERSHIP_CONFLICT):
        sending.result(WAIT_S)
    assert provider.steers == []
    assert control.agents.get(started.child_id) is squatter
    release.set()
    settle(control, started.task_id, parent)
    assert carrying(events(control, started.child_id), "to whom?") == []


@without_live_input
def test_a_held_message_the_published_run_cannot_take_is_not_delivered(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
    script: dict[str, object],
) -> None:
    gate = threading.Event()
    started, _ = starting_child(control, parent, provider, gate, result_gate=release, **script)

    sending = send_held(control, parent, started.child_id, "early")
    gate.set()

    with raises(ErrorCode.NOT_DELIVERED):
        sending.result(WAIT_S)
    assert provider.resumes == []
    release.set()
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    assert carrying(events(control, started.child_id), "early") == []


def test_a_foreign_send_before_publication_is_task_not_found_and_not_held(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
) -> None:
    gate = threading.Event()
    started, _ = starting_child(control, parent, provider, gate)

    with raises(ErrorCode.TASK_NOT_FOUND):
        control.send_message(stranger, started.child_id, text("let me in early"))

    assert held_messages(control, started.child_id) == 0
    gate.set()
    settle(control, started.task_id, parent)
    assert provider.steers == []
    assert carrying(events(control, started.child_id), "let me in early") == []
