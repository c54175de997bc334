"""Approvals across processes (SPEC §11): a runtime's child asks, its parent's notice is
drained, the runtime is SIGKILLed — waiting on the request, or parked — and the answer
given from another runtime goes on with the Task that asked: the tool runs exactly once,
the turn completes, the notice is never given again. SQLite and PostgreSQL; every process
a test starts is reaped, pass or fail."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.reliability.approval_child import deploy_tool
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S

CHILD = Path(__file__).with_name("approval_child.py")

pytestmark = pytest.mark.timeout(120)

reaped = pytest.fixture(reaping, name="reaped")


@pytest.mark.parametrize("grace_s", ["30", "0.05"], ids=["waiting", "parked"])
@pytest.mark.slow  # measured: 16 s under load (--durations)
def test_an_answer_from_another_runtime_after_a_sigkill_runs_the_tool_once_and_completes(
    reaped: Reaper, store_url: str, tmp_path: Path, grace_s: str
) -> None:
    runs = tmp_path / "runs.jsonl"
    runtime = reaped.add(LinesProcess(CHILD, store_url, str(runs), grace_s, name="asker"))
    ready = json.loads(runtime.expect("READY ").removeprefix("READY "))
    (notice,) = ready["notices"]
    assert "deploy" in notice
    assert ready["request_id"] in notice
    runtime.proc.send_signal(signal.SIGKILL)
    runtime.reap()

    with SubagentControl.open(store_url, lease_ttl_s=30.0) as control:
        control.providers.register(
            InProcessProvider(ScriptedModel(["shipped"]), tools=[deploy_tool(runs)])
        )
        parent = control.agents.register("approver")
        task_id = ready["task_id"]
        assert control.tasks.get(task_id, requester=parent).status is (TaskStatus.INPUT_REQUIRED)
        assert control.tasks.drain_notices(parent) == []  # once, across runtimes

        control.answer(parent, ready["request_id"], allow=True)
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.id == task_id
        assert done.status is TaskStatus.COMPLETED, done
        assert done.outcome is not None
        assert done.outcome.output == "shipped"
        assert runs.read_text().splitlines() == ['{"env": "prod"}']
        assert control.store is not None
        kinds = [e.kind for e in control.store.load(ready["child_id"]).events]
        for kind in (EventKind.TURN_START, EventKind.APPROVAL_REQUEST,
                     EventKind.APPROVAL_ANSWER, "tool/result", EventKind.TURN_END):  # fmt: skip
            assert kinds.count(kind) == 1, (kind, kinds)
        (completed,) = control.tasks.drain_notices(parent)
        assert completed.status is TaskStatus.COMPLETED


@pytest.mark.slow  # measured: 13 s under load (--durations)
def test_an_acp_agents_request_is_closed_and_its_task_interrupted_when_its_runtime_dies(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("acp", reason="the acp extra is not installed")
    state = tmp_path / "agent-state"
    runtime = reaped.add(
        LinesProcess(CHILD, store_url, str(tmp_path / "runs"), "30", str(state), name="acp")
    )
    ready = json.loads(runtime.expect("READY ").removeprefix("READY "))
    runtime.proc.send_signal(signal.SIGKILL)
    runtime.reap()
    try:
        with SubagentControl.open(store_url, lease_ttl_s=30.0) as control:
            parent = control.agents.register("approver")
            task_id = ready["task_id"]
            deadline = time.monotonic() + WAIT_S
            while control.tasks.get(task_id, requester=parent).status is not (
                TaskStatus.INTERRUPTED
            ):
                assert time.monotonic() < deadline, "the dead runtime's ACP ask was not closed"
                time.sleep(0.05)
            with pytest.raises(SubagentControlError) as closed:
                control.answer(parent, ready["request_id"], allow=True)
            assert closed.value.code is ErrorCode.REQUEST_CLOSED
            assert control.store is not None
            (end,) = [
                e for e in control.store.load(ready["child_id"]).events
                if e.kind == EventKind.TURN_END
            ]  # fmt: skip
            assert end.data["status"] == "interrupted"
    finally:
        _kill_agents(state)


def _kill_agents(state: Path) -> None:
    """The killed runtime's agent ends on its closed stdin; bounded, then SIGKILLed."""
    pids = state / "pids"
    for pid in [int(p) for p in pids.read_text().split()] if pids.exists() else []:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # a worker process and a console on one store
def test_a_console_without_the_provider_steers_and_answers_a_parked_child_its_worker_goes_on(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.jsonl"
    worker = reaped.add(LinesProcess(CHILD, store_url, str(runs), "0.05", name="worker"))
    ready = json.loads(worker.expect("READY ").removeprefix("READY "))
    task_id = ready["task_id"]
    human = MessageSource(kind="human", sender_session_id="alice")

    with SubagentControl.open(store_url, lease_ttl_s=30.0) as console:  # no providers
        parent = console.agents.register("approver")
        steer = [TextBlock(text="check the logs too")]
        steered = console.send_message(parent, ready["child_id"], steer, human)
        assert (steered.route, steered.task_id) == ("steered", task_id)
        console.answer(parent, ready["request_id"], allow=True, source=human)
        # The worker, which has the provider, continues the same Task from the store.
        done = console.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.runtime_id != console.runtime_id
        assert console.store is not None
        events = console.store.load(ready["child_id"]).events
    assert runs.read_text().splitlines() == ['{"env": "prod"}']
    steers = [e.data["text"] for e in events if e.kind == EventKind.STEERING_MESSAGE]
    assert steers == ["check the logs too"]
    assert [e.kind for e in events].count(EventKind.TURN_END) == 1
