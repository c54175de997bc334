"""Metrics: activations by route and outcome, sends by route or error code, store retries by
cause; steer, resume and activation-duration histograms; live activations, held messages
and live supervisors."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from controlplane import AgentHandle, ErrorCode, SubagentControl, SubagentResult
from persistence import RetryPolicy
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    MakeControl,
    eventually,
    held_messages,
    in_thread,
    raises,
    running_child,
    settle,
    start_child,
    starting_child,
    text,
)
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(60)


def test_a_start_a_steer_a_kill_a_resume_and_a_failed_turn_are_counted(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
    otel: Otel,
) -> None:
    child_id, first_task, _plan = running_child(control, parent, provider, hold)
    assert otel.value("subagent.activations.live") == 1
    assert otel.value("subagent.supervisors.live") == 1
    control.send_message(parent, child_id, text("steer"))
    control.tasks.kill(first_task, requester=parent)
    settle(control, first_task, parent)
    resumed = control.send_message(parent, child_id, text("resume"))
    settle(control, resumed.task_id, parent)
    provider.plan(result=SubagentResult(stop_reason="refusal"))
    failing = control.send_message(parent, child_id, text("fail"))
    settle(control, failing.task_id, parent)
    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, child_id, b"not a message")  # type: ignore[arg-type]

    assert otel.value("subagent.activations", subagent__route="initial") == 1
    assert otel.value("subagent.activations", subagent__outcome__status="killed") == 1
    assert otel.value("subagent.activations", subagent__route="resumed") == 2
    assert otel.value("subagent.activations", subagent__outcome__status="completed") == 1
    assert otel.value("subagent.activations", subagent__outcome__status="failed") == 1
    assert otel.value("subagent.sends", subagent__route="steered") == 1
    assert otel.value("subagent.sends", subagent__route="started") == 2
    assert otel.value("subagent.sends", error__type="INVALID_INPUT") == 1
    assert otel.count("subagent.steer.duration") == 1
    assert otel.count("subagent.resume.latency") == 2
    assert otel.count("subagent.activation.duration", subagent__route="resumed") == 2
    assert otel.count("subagent.activation.duration", subagent__outcome__status="killed") == 1
    assert otel.value("subagent.activations.live") == 0
    assert otel.value("subagent.supervisors.live") == 1
    assert otel.value("subagent.store.retries") == 0


def test_a_message_held_until_publication_is_counted_while_it_waits(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
    otel: Otel,
) -> None:
    gate = threading.Event()
    started, _plan = starting_child(control, parent, provider, gate, result_gate=hold)
    sent = in_thread(lambda: control.send_message(parent, started.child_id, text("early")))
    eventually(lambda: held_messages(control, started.child_id) == 1, "the message is held")

    assert otel.value("subagent.messages.held") == 1
    gate.set()
    assert sent.result(timeout=WAIT_S).route == "steered"
    assert otel.value("subagent.messages.held") == 0


def test_supervisors_are_counted_until_they_stop(make_control: MakeControl, otel: Otel) -> None:
    control = make_control(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    owner = control.agents.register("parent-1", model=PARENT_MODEL)
    settle(control, start_child(control, owner).task_id, owner)
    assert otel.value("subagent.supervisors.live") == 1

    control.close()
    assert otel.value("subagent.supervisors.live") == 0


def test_store_retries_are_counted_by_cause(
    make_control: MakeControl, tmp_path: Path, otel: Otel
) -> None:
    path = tmp_path / "retried.db"
    control = make_control(
        f"sqlite:///{path}?timeout=0.01",
        retry=RetryPolicy.immediate(max_attempts=3),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    owner = control.agents.register("parent-1", model=PARENT_MODEL)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with raises(ErrorCode.STORE_UNAVAILABLE):
            start_child(control, owner)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    assert otel.value("subagent.store.retries", subagent__retry__cause="busy") == 2
