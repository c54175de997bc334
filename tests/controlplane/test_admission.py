"""SPEC §11 "Concurrency limits" in one runtime: the queue's order, what a queued Task
reads, kills and closes of queued Tasks, messages to a queued child, and bad limits."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStart,
    ErrorCode,
    EventKind,
    SubagentControl,
    TaskStatus,
)
from persistence import SqlStore
from tests.fakes import FakeProvider, completed
from tests.support import (
    WAIT_S,
    MakeControl,
    events,
    in_thread,
    inbound,
    kinds,
    raises,
    settle,
    start_child,
    text,
)

LIMITED = {"fake": 1}


def _status(control: SubagentControl, task_id: str, parent: AgentHandle) -> TaskStatus:
    return control.tasks.get(task_id, requester=parent).status


def holding_the_slot(
    make_control: MakeControl, provider: FakeProvider
) -> tuple[SubagentControl, AgentHandle, threading.Event, ContinuableStart]:
    """A control plane under `LIMITED` whose one slot a started child holds until ``gate``
    is set: every start or resume after it is queued."""
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    gate = threading.Event()
    provider.plan(result_gate=gate)
    return control, parent, gate, start_child(control, parent)


def test_a_start_past_the_limit_reads_queued_and_the_queue_runs_in_order(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    gates = [threading.Event() for _ in range(3)]
    plans = [
        provider.plan(result_gate=gate, result=completed(f"r{i}")) for i, gate in enumerate(gates)
    ]
    starts = [start_child(control, parent, label=f"job {i}") for i in range(3)]

    assert plans[0].entered.wait(WAIT_S)
    first, second, third = (control.tasks.get(s.task_id, requester=parent) for s in starts)
    assert (first.status, first.queue_position) == (TaskStatus.RUNNING, None)
    assert (second.status, second.queue_position) == (TaskStatus.QUEUED, 1)
    assert (third.status, third.queue_position) == (TaskStatus.QUEUED, 2)
    assert second.queued_at is not None
    assert not plans[1].entered.is_set()  # nothing of a queued Task runs

    gates[0].set()
    assert plans[1].entered.wait(WAIT_S)
    assert _status(control, starts[1].task_id, parent) is TaskStatus.RUNNING
    third_now = control.tasks.get(starts[2].task_id, requester=parent)
    assert (third_now.status, third_now.queue_position) == (TaskStatus.QUEUED, 1)
    assert not plans[2].entered.is_set()
    gates[1].set()
    gates[2].set()

    outputs = [settle(control, s.task_id, parent) for s in starts]
    assert [o.outcome.output for o in outputs if o.outcome] == ["r0", "r1", "r2"]
    assert [r.child_id for r in provider.starts] == [s.child_id for s in starts]
    admitted = outputs[1]
    assert admitted.admitted_at is not None
    assert admitted.queued_at is not None
    assert admitted.admitted_at >= admitted.queued_at


def test_tasks_wait_keeps_waiting_through_queued(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control, parent, gate, holder = holding_the_slot(make_control, provider)
    queued = start_child(control, parent)

    with raises(ErrorCode.TIMEOUT):
        control.tasks.wait(queued.task_id, timeout=0.05, requester=parent)
    assert not TaskStatus.QUEUED.is_terminal
    gate.set()
    assert settle(control, queued.task_id, parent).status is TaskStatus.COMPLETED
    assert settle(control, holder.task_id, parent).status is TaskStatus.COMPLETED


def test_a_resume_past_the_limit_is_started_at_once_and_queued(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    idle = start_child(control, parent)
    settle(control, idle.task_id, parent)
    gate = threading.Event()
    holding = provider.plan(result_gate=gate)
    holder = start_child(control, parent)
    assert holding.entered.wait(WAIT_S)

    sent = control.send_message(parent, idle.child_id, text("continue"))

    assert sent.route == "started"
    assert _status(control, sent.task_id, parent) is TaskStatus.QUEUED
    gate.set()
    assert settle(control, sent.task_id, parent).status is TaskStatus.COMPLETED
    assert inbound(events(control, idle.child_id), "continue")
    settle(control, holder.task_id, parent)


def test_a_steer_to_a_running_child_is_never_queued(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    gate = threading.Event()
    running = provider.plan(result_gate=gate)
    started = start_child(control, parent)
    assert running.returned.wait(WAIT_S)
    waiting = start_child(control, parent)  # the limit is full: this one queues

    sent = control.send_message(parent, started.child_id, text("steer me"))

    assert (sent.route, sent.task_id) == ("steered", started.task_id)
    assert provider.steered_texts(started.child_id) == ["steer me"]
    assert _status(control, waiting.task_id, parent) is TaskStatus.QUEUED
    gate.set()
    settle(control, waiting.task_id, parent)


def test_a_message_to_a_queued_child_is_held_and_delivered_when_it_runs(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    gate, second_gate = threading.Event(), threading.Event()
    provider.plan(result_gate=gate)
    queued_plan = provider.plan(result_gate=second_gate)
    start_child(control, parent)
    queued = start_child(control, parent)

    sending = in_thread(lambda: control.send_message(parent, queued.child_id, text("held")))
    assert not sending.done()  # held: not refused, not delivered while queued
    gate.set()
    assert queued_plan.returned.wait(WAIT_S)
    sent = sending.result(WAIT_S)

    assert (sent.route, sent.task_id) == ("steered", queued.task_id)
    assert provider.steered_texts(queued.child_id) == ["held"]
    second_gate.set()
    settle(control, queued.task_id, parent)
    assert len(inbound(events(control, queued.child_id), "held")) == 1


def test_killing_a_queued_task_settles_it_killed_at_once_and_frees_its_place(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control, parent, gate, holder = holding_the_slot(make_control, provider)
    doomed = start_child(control, parent)
    after = start_child(control, parent)
    assert control.tasks.get(after.task_id, requester=parent).queue_position == 2

    control.tasks.kill(doomed.task_id, requester=parent)

    killed = settle(control, doomed.task_id, parent)  # before the holder's slot frees
    assert killed.status is TaskStatus.KILLED
    assert control.tasks.get(after.task_id, requester=parent).queue_position == 1
    assert _status(control, holder.task_id, parent) is TaskStatus.RUNNING
    gate.set()
    assert settle(control, after.task_id, parent).status is TaskStatus.COMPLETED
    assert [r.child_id for r in provider.starts] == [holder.child_id, after.child_id]
    assert control.store is not None
    stored = {c.child_id for c in control.store.list_children("parent-1")}
    assert stored == {holder.child_id, after.child_id}  # the killed start left no child


def test_a_killed_queued_resume_ends_its_turn_with_the_message_in_it(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    idle = start_child(control, parent)
    settle(control, idle.task_id, parent)
    gate = threading.Event()
    provider.plan(result_gate=gate)
    holder = start_child(control, parent)
    sent = control.send_message(parent, idle.child_id, text("never run"))

    control.tasks.kill(sent.task_id, requester=parent)

    assert settle(control, sent.task_id, parent).status is TaskStatus.KILLED
    stored = events(control, idle.child_id)
    assert len(inbound(stored, "never run")) == 1
    assert kinds(stored)[-1] == EventKind.TURN_END
    assert len(provider.resumes) == 0
    gate.set()
    settle(control, holder.task_id, parent)


def test_close_settles_queued_tasks_killed(
    make_control: MakeControl, provider: FakeProvider, url: str
) -> None:
    control = make_control(concurrency=LIMITED)
    parent = control.agents.register("parent-1")
    provider.plan(result_gate=threading.Event())
    holder = start_child(control, parent)
    queued = start_child(control, parent)

    control.close(timeout_s=WAIT_S)

    store = SqlStore(url)
    try:
        for task_id in (holder.task_id, queued.task_id):
            stored = store.ledger.get(task_id)
            assert stored is not None
            assert stored.status is TaskStatus.KILLED
    finally:
        store.close()
    assert len(provider.starts) == 1  # the queued one never ran


def test_only_the_limited_key_queues(make_control: MakeControl, provider: FakeProvider) -> None:
    other = FakeProvider("other")
    control = make_control(concurrency={"fake:m1": 1})
    control.providers.register(other)
    parent = control.agents.register("parent-1")
    gate = threading.Event()
    provider.default_plan(result_gate=gate)
    other.default_plan(result_gate=gate)
    limited = start_child(control, parent, agent_model="m1")
    second = start_child(control, parent, agent_model="m1")
    unlimited = start_child(control, parent, agent_model="m2")
    elsewhere = start_child(control, parent, provider="other", agent_model="m1")

    assert _status(control, second.task_id, parent) is TaskStatus.QUEUED
    for started in (limited, unlimited, elsewhere):
        assert _status(control, started.task_id, parent) is TaskStatus.RUNNING
    gate.set()
    for started in (limited, second, unlimited, elsewhere):
        settle(control, started.task_id, parent)


@pytest.mark.parametrize(
    "concurrency",
    [
        {"": 1},
        {"fake": 0},
        {"fake": -1},
        {"fake": True},
        {"fake": 1.5},
        {"fake": "2"},
        {3: 1},
        ["fake"],
    ],
    ids=["empty-key", "zero", "negative", "bool", "float", "str", "int-key", "not-a-mapping"],
)
def test_bad_concurrency_is_invalid_input_and_opens_nothing(
    tmp_path: Path, concurrency: object
) -> None:
    db = tmp_path / "never.db"

    with raises(ErrorCode.INVALID_INPUT):
        SubagentControl.open(f"sqlite:///{db}", concurrency=concurrency)
    with raises(ErrorCode.INVALID_INPUT):
        SubagentControl(concurrency=concurrency)  # type: ignore[arg-type]

    assert not db.exists()


def test_the_tree_shows_a_queued_activations_place(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control, parent, gate, holder = holding_the_slot(make_control, provider)
    queued = start_child(control, parent)

    nodes = {n.child_id: n for n in control.dump_tree().supervisors}

    node = nodes[queued.child_id]
    assert node.task_status == TaskStatus.QUEUED.value
    assert node.activation is not None
    assert node.activation.queue_position == 1
    assert node.activation.queued_s is not None
    assert node.activation.queued_s >= 0
    holding = nodes[holder.child_id].activation
    assert holding is not None
    assert holding.queue_position is None
    gate.set()
    settle(control, queued.task_id, parent)


def test_an_activation_under_two_limited_keys_waits_its_turn_under_each(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(concurrency={"fake": 2, "fake:m1": 1})
    parent = control.agents.register("parent-1")
    gate = threading.Event()
    provider.default_plan(result_gate=gate)
    first_m1 = start_child(control, parent, agent_model="m1")
    second_m1 = start_child(control, parent, agent_model="m1")  # fake:m1 is full
    # fake has room, but first in fake's line is second_m1: FIFO per key.
    first_m2 = start_child(control, parent, agent_model="m2")
    starts = (first_m1, second_m1, first_m2)

    assert [_status(control, s.task_id, parent) for s in starts] == [
        TaskStatus.RUNNING,
        TaskStatus.QUEUED,
        TaskStatus.QUEUED,
    ]
    assert control.tasks.get(first_m2.task_id, requester=parent).queue_position == 2
    gate.set()
    for started in starts:
        assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    assert provider.starts[0].child_id == first_m1.child_id
