"""Every documented metric (`controlplane.telemetry.METRICS`) exports a point in one mixed
scenario on one control plane: a message held until publication and steered, a kill, a
resume, a model call that reports tokens, and a store that retries while it is locked.
Each was tested alone; together, none may stay silent."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from controlplane import ErrorCode, InProcessProvider, ScriptedModel, Usage
from controlplane.telemetry import METRICS
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
    settle,
    start_child,
    starting_child,
    text,
)
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(60)


def test_every_documented_metric_exports_a_point_in_one_mixed_scenario(
    make_control: MakeControl, provider: FakeProvider, tmp_path: Path, otel: Otel
) -> None:
    path = tmp_path / "mixed.db"
    control = make_control(
        f"sqlite:///{path}?timeout=0.01",
        retry=RetryPolicy.immediate(max_attempts=3),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    model = ScriptedModel(["hello"], usage=Usage(input_tokens=7, output_tokens=2))
    control.providers.register(InProcessProvider(model))
    owner = control.agents.register("parent-1", model=PARENT_MODEL)

    # Held until publication, then steered; the turn is killed, and the child resumed.
    gate, hold = threading.Event(), threading.Event()
    started, _plan = starting_child(control, owner, provider, gate, result_gate=hold)
    sent = in_thread(lambda: control.send_message(owner, started.child_id, text("early")))
    eventually(lambda: held_messages(control, started.child_id) == 1, "the message is held")
    gate.set()
    assert sent.result(timeout=WAIT_S).route == "steered"
    control.tasks.kill(started.task_id, requester=owner)
    settle(control, started.task_id, owner)
    resumed = control.send_message(owner, started.child_id, text("go on"))
    settle(control, resumed.task_id, owner)
    # A model call that reports its tokens.
    settle(control, start_child(control, owner, provider="inprocess").task_id, owner)
    # The store is locked: the start is retried, then refused.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with raises(ErrorCode.STORE_UNAVAILABLE):
            start_child(control, owner)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    silent = sorted(name for name in METRICS if not otel.points(name))
    assert silent == []
    assert otel.count("subagent.resume.latency") == 1
    assert otel.value("subagent.store.retries", subagent__retry__cause="busy") == 2
    # Up-down counters export their point after going back to zero.
    assert otel.value("subagent.messages.held") == 0
    assert otel.count("gen_ai.client.token.usage", gen_ai__token__type="input") == 1
