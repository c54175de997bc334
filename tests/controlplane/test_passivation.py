"""Passivation: an idle child's supervisor retires (its thread ends); the child's next
message makes a new supervisor and resumes it, and no message is lost or doubled in the
hand-over."""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial

import pykka
import pytest

import actors.root
from actors.messages import PassivateIfIdle
from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
)
from tests.controlplane.test_races import assert_in_transcript_once, coordinator, race
from tests.fakes import FakeProvider
from tests.support import WAIT_S, MakeControl, carrying, events, idle_child, settle, text


@pytest.fixture
def rounds(store_url: str) -> int:
    return 100 if store_url.startswith("sqlite") else 30


def supervisor_of(control: SubagentControl, child_id: str) -> object:
    route = control._routes.get(child_id)
    return None if route is None else route.supervisor.ref


def offer_retirement(control: SubagentControl, child_id: str) -> None:
    """What a sweep does, at once: offer the supervisor to retire if idle at all."""
    route = control._routes.get(child_id)
    assert route is not None
    route.supervisor.ref.ask(PassivateIfIdle(idle_for_s=0.0), timeout=WAIT_S)


def offer_retirement_now(control: SubagentControl, child_id: str) -> None:
    """The same offer, not waiting for the supervisor to take it."""
    route = control._routes.get(child_id)
    if route is not None:
        with contextlib.suppress(pykka.ActorDeadError):
            route.supervisor.ref.tell(PassivateIfIdle(idle_for_s=0.0))


def test_an_idle_childs_supervisor_retires_and_its_next_message_resumes_it(
    make_control: MakeControl,
) -> None:
    control = make_control(passivate_after_s=0.05)
    parent = control.agents.register("parent-1")
    child_id = idle_child(control, parent)

    assert control._routes.wait_absent(child_id, WAIT_S)
    assert all(node.child_id != child_id for node in control.dump_tree().supervisors)

    result = control.send_message(parent, child_id, text("carry on"))
    assert result.route == "started"
    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
    kinds = [event.kind for event in events(control, child_id)]
    assert kinds.count(EventKind.TURN_START) == 2
    assert len(carrying(events(control, child_id), "carry on")) == 1


def test_a_busy_supervisor_is_never_passivated(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    release = threading.Event()
    plan = provider.plan(result_gate=release)
    result = control.send_message(parent, child_id, text("work on"))
    assert plan.returned.wait(WAIT_S)

    supervisor = supervisor_of(control, child_id)
    offer_retirement(control, child_id)

    assert supervisor_of(control, child_id) is supervisor
    steered = control.send_message(parent, child_id, text("and this"))
    assert (steered.route, steered.task_id) == ("steered", result.task_id)
    release.set()
    settle(control, result.task_id, parent)


def test_an_idle_supervisor_retires_only_after_the_idle_period(
    control: SubagentControl, parent: AgentHandle
) -> None:
    child_id = idle_child(control, parent)
    supervisor = supervisor_of(control, child_id)
    route = control._routes.get(child_id)
    assert route is not None

    route.supervisor.ref.ask(PassivateIfIdle(idle_for_s=3600.0), timeout=WAIT_S)
    assert supervisor_of(control, child_id) is supervisor
    route.supervisor.ref.ask(PassivateIfIdle(idle_for_s=0.0), timeout=WAIT_S)
    assert control._routes.wait_absent(child_id, WAIT_S)


@pytest.mark.parametrize(
    "passivate_after_s", [0, -1.0, 1e-6, 0.049, float("nan"), float("inf"), True, "60"]
)
def test_a_passivation_period_that_is_not_positive_seconds_is_refused(
    make_control: MakeControl, passivate_after_s: object
) -> None:
    with pytest.raises(SubagentControlError) as raised:
        make_control(passivate_after_s=passivate_after_s)
    assert raised.value.code == ErrorCode.INVALID_INPUT


def test_sends_racing_passivation_are_each_delivered_once_or_refused(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    child_id = idle_child(control, parent)
    for i in range(rounds):
        message = f"racing passivation {i}"
        offer = partial(offer_retirement_now, control, child_id)
        send = partial(control.send_message, parent, child_id, text(message))
        _, sent = race(offer, send)

        assert isinstance(sent, SendResult), sent  # an idle child is always resumable
        assert sent.route == "started"
        assert settle(control, sent.task_id, parent).status is TaskStatus.COMPLETED
        assert_in_transcript_once(control, child_id, message, coordinator(parent))
        assert provider.max_live[child_id] == 1


def _idle_in_tree(control: SubagentControl, child_ids: list[str]) -> bool:
    """Whether every one of ``child_ids`` has a supervisor that reports itself idle."""
    nodes = {node.child_id: node for node in control.dump_tree(timeout_s=WAIT_S).supervisors}
    return all(c in nodes and nodes[c].state == "idle" for c in child_ids)


def test_past_the_cap_idle_supervisors_retire_at_once_whatever_passivate_after_s_says(
    make_control: MakeControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.root, "IDLE_SUPERVISOR_CAP", 2)
    monkeypatch.setattr(actors.root, "CAPPED_IDLE_S", 0.0)
    monkeypatch.setattr(actors.root, "CAPPED_SWEEP_S", 0.0)
    control = make_control()  # the default passivate_after_s: 300 s
    parent = control.agents.register("parent-1")
    idle = [idle_child(control, parent), idle_child(control, parent)]
    deadline = time.monotonic() + WAIT_S
    for _ in range(1000):  # each round is a dump: an ask answered after what is queued
        if _idle_in_tree(control, idle) or time.monotonic() > deadline:
            break
    assert _idle_in_tree(control, idle)
    assert control._routes.wait_absent(idle[0], 0.0) is False  # the cap is not passed yet

    third = idle_child(control, parent)  # its supervisor is the third: past the cap

    assert control._routes.wait_absent(idle[0], WAIT_S)
    assert control._routes.wait_absent(idle[1], WAIT_S)
    # Nothing is lost: a retired child's next message resumes it in a new supervisor.
    for child_id in [*idle, third]:
        result = control.send_message(parent, child_id, text("carry on"))
        assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
