"""Recovery (SPEC §9): a running turn outlives its runtime. A runtime is SIGKILLed mid model
call, mid tool call, after a resume's turn began, right after its ``started`` (nothing of
the turn written since the answer: the message went in with the claim), after a steer's
``steered``; another
runtime with the child's provider carries the SAME Task on in the SAME turn: one
``turn/start`` and one ``turn/end`` for the turn, every acknowledged message in it once, no
tool run twice unless idempotent, one ``task/recovered`` event, the Task ``completed``. A
child that keeps killing its runtime is stopped at the bound. ``recover=False`` keeps the
interrupted path. SQLite and PostgreSQL; every process a test starts is reaped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane import (
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from tests.reliability.processes import REPO, LinesProcess, Reaper, reaping
from tests.reliability.recovery_child import PARENT, work_tool
from tests.reliability.recovery_setup import CHILD, idle_child, killed_at
from tests.support import WAIT_S, eventually

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")


def _turn(events: list[SessionEvent], task_id: str) -> list[SessionEvent]:
    """The events of the turn ``task_id`` opened."""
    (start,) = [
        e for e in events
        if e.kind == EventKind.TURN_START and e.data.get("task_id") == task_id
    ]  # fmt: skip
    return [e for e in events if e.turn == start.turn]


def _texts(events: list[SessionEvent], kind: str) -> list[str]:
    return [e.data["text"] for e in events if e.kind == kind]


@pytest.mark.parametrize("mode", ["model", "tool", "idempotent", "resumed", "acked", "steered"])
def test_another_runtime_finishes_the_same_task_in_the_same_turn(
    reaped: Reaper, store_url: str, tmp_path: Path, mode: str
) -> None:
    runs = tmp_path / "runs.jsonl"
    ready = killed_at(reaped, store_url, mode, runs)
    task_id, child_id = str(ready["task_id"]), str(ready["child_id"])

    with SubagentControl.open(store_url, lease_ttl_s=30.0) as control:
        model = ScriptedModel(["finished after recovery"])
        tools = [work_tool(runs, idempotent=mode == "idempotent")]
        control.providers.register(InProcessProvider(model, tools=tools))
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.id == task_id
        assert done.status is TaskStatus.COMPLETED, done
        assert done.outcome is not None
        assert done.outcome.output == "finished after recovery"
        assert done.recoveries == 1
        assert control.store is not None
        turn = _turn(control.store.load(child_id).events, task_id)

    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert turn[-1].kind == EventKind.TURN_END
    assert turn[-1].data["status"] == "completed"
    (recovered,) = [e for e in turn if e.kind == EventKind.TASK_RECOVERED]
    assert recovered.data["task_id"] == task_id
    assert recovered.data["from_runtime"] == ready["runtime_id"]
    assert recovered.data["recovery"] == 1
    prompts = _texts(turn, EventKind.USER_MESSAGE)
    steers = _texts(turn, EventKind.STEERING_MESSAGE)
    for text in ready["acked"]:  # type: ignore[attr-defined]
        assert [*prompts, *steers].count(text) == 1, (text, prompts, steers)
    assert len(prompts) == 1
    ran = runs.read_text().splitlines() if runs.exists() else []
    if mode == "tool":
        assert ran == ['{"item": "a"}']  # run once: its result says it was interrupted
        (result,) = [e for e in turn if e.kind == "tool/result"]
        assert result.data.get("interrupted") is True
    elif mode == "idempotent":
        assert ran == ['{"item": "a"}', '{"item": "a"}']  # run again, as declared safe
    else:
        assert ran == []
    # Replies: the model's, once each, and only the recovered turn's final one at the end.
    assert _texts(turn, EventKind.ASSISTANT_MESSAGE)[-1] == "finished after recovery"


def test_a_child_that_keeps_killing_its_runtime_stops_at_the_bound(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    runs = str(tmp_path / "runs.jsonl")
    for n in range(5):  # the starter, three recoveries (each dies), then the bound
        proc = subprocess.run(
            [sys.executable, str(CHILD), store_url, "recoverer" if n else "suicide", runs],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if proc.returncode != -signal.SIGKILL:
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "SETTLED" in proc.stdout
            break
    assert n == 4  # killed by the child four times: started, then recovered three times
    with SubagentControl.open(store_url, lease_ttl_s=30.0, recover=False) as control:
        parent = control.agents.register(PARENT)
        tasks = control.tasks.list(requester=parent)
        assert len(tasks) >= 1
        first = min(tasks, key=lambda t: t.created_at)
        assert control.store is not None
        assert first.child_id is not None
        events = control.store.load(first.child_id).events
    recovered = [e for e in _turn(events, first.id) if e.kind == EventKind.TASK_RECOVERED]
    assert first.status is TaskStatus.INTERRUPTED, (n, first)
    assert len(recovered) == 3
    assert first.outcome is not None
    assert "limit is 3" in (first.outcome.detail or "")
    assert events[-1].kind == EventKind.TURN_END
    assert events[-1].data["status"] == "interrupted"


def test_recover_false_settles_the_dead_runtimes_task_interrupted(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    ready = killed_at(reaped, store_url, "model", tmp_path / "runs.jsonl")
    with SubagentControl.open(store_url, lease_ttl_s=30.0, recover=False) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["never"])))
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(str(ready["task_id"]), timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.INTERRUPTED
        assert done.recoveries == 0


def test_close_during_a_long_turn_hands_it_over_to_a_live_runtime(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.jsonl"
    with SubagentControl.open(store_url, lease_ttl_s=3.0) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["finished elsewhere"])))
        parent = control.agents.register(PARENT)
        closing = reaped.add(
            LinesProcess(CHILD, store_url, "close", str(runs), "0.5", name="closing")
        )
        ready = json.loads(closing.expect("READY ").removeprefix("READY "))
        closing.say("close")
        closed = closing.expect("CLOSED ")
        assert float(closed) < 5.0  # stopped once its grace (0.5 s) was over, not later
        done = control.tasks.wait(str(ready["task_id"]), timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.outcome is not None
        assert done.outcome.output == "finished elsewhere"
        assert done.recoveries == 1
        assert control.store is not None
        turn = _turn(control.store.load(str(ready["child_id"])).events, str(ready["task_id"]))
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert kinds.count(EventKind.TASK_RECOVERED) == 1, kinds


def test_a_task_whose_provider_no_runtime_has_waits_running_then_ends_naming_it(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    ready = killed_at(reaped, store_url, "model", tmp_path / "runs.jsonl")
    task_id = str(ready["task_id"])
    # A runtime without the provider leaves it running for one that has it...
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as front:
        parent = front.agents.register(PARENT)
        seen = front.tasks.get(task_id, requester=parent)
        assert seen.status is TaskStatus.RUNNING, seen.outcome
    # ...for as long as it is told to wait, then ends it, saying which provider it lacked.
    with SubagentControl.open(store_url, lease_ttl_s=30.0, provider_wait_s=0.001) as front:
        parent = front.agents.register(PARENT)
        done = front.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.INTERRUPTED
    assert done.outcome is not None
    assert "no runtime with its provider 'inprocess'" in (done.outcome.detail or "")


def test_a_runtime_without_the_provider_leaves_a_resume_to_a_worker_that_has_it(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    child_id = idle_child(store_url)

    # A front: no provider. It takes the message, durably, and answers `started`...
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as front:
        parent = front.agents.register(PARENT)
        sent = front.send_message(parent, child_id, [TextBlock(text="go on")])
        assert sent.route == "started"

        def waiting() -> bool:
            seen = front.tasks.get(sent.task_id, requester=parent)
            assert seen.status in (TaskStatus.RUNNING, TaskStatus.QUEUED), seen.outcome
            return seen.status is TaskStatus.QUEUED and seen.waiting_for == "inprocess"

        eventually(waiting, "the task reads queued, naming the provider it waits for")
        # ...and a worker runtime with the provider, in another process, runs it.
        worker = reaped.add(LinesProcess(CHILD, store_url, "worker", str(tmp_path / "r"),
                                         name="worker"))  # fmt: skip
        done = front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done.outcome
        assert done.outcome is not None
        assert done.outcome.output == "done by the worker"
        assert done.runtime_id != front.runtime_id
        worker.expect("SETTLED")
        assert front.store is not None
        turn = _turn(front.store.load(child_id).events, sent.task_id)
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert turn[-1].data["status"] == "completed"
    assert _texts(turn, EventKind.USER_MESSAGE) == ["go on"]


def test_a_resume_no_runtime_with_the_provider_takes_ends_interrupted_naming_it(
    store_url: str,
) -> None:
    child_id = idle_child(store_url)
    with SubagentControl.open(store_url, lease_ttl_s=0.6, provider_wait_s=0.001) as front:
        parent = front.agents.register(PARENT)
        sent = front.send_message(parent, child_id, [TextBlock(text="go on")])
        assert sent.route == "started"
        done = front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert front.store is not None
        events = front.store.load(child_id).events
    assert done.status is TaskStatus.INTERRUPTED, done.outcome
    assert done.outcome is not None
    assert "its provider 'inprocess'" in (done.outcome.detail or "")
    turn = _turn(events, sent.task_id)
    assert _texts(turn, EventKind.USER_MESSAGE) == ["go on"]
    assert turn[-1].kind == EventKind.TURN_END
    assert turn[-1].data["status"] == "interrupted"


def test_a_resume_waiting_for_a_runtime_with_its_provider_can_be_killed(store_url: str) -> None:
    child_id = idle_child(store_url)
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as front:
        parent = front.agents.register(PARENT)
        sent = front.send_message(parent, child_id, [TextBlock(text="go on")])
        eventually(
            lambda: front.tasks.get(sent.task_id, requester=parent).waiting_for is not None,
            "the task waits for a runtime with its provider",
        )
        front.tasks.kill(sent.task_id, requester=parent)
        done = front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert front.store is not None
        events = front.store.load(child_id).events
    assert done.status is TaskStatus.KILLED, done.outcome
    turn = _turn(events, sent.task_id)
    assert _texts(turn, EventKind.USER_MESSAGE) == ["go on"]
    assert turn[-1].kind == EventKind.TURN_END
    assert turn[-1].data["status"] == "killed"


def test_a_second_message_joins_the_turn_that_waits_for_a_provider(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    child_id = idle_child(store_url)
    seen = tmp_path / "seen.jsonl"
    # A front without the provider takes both messages, durably, into one waiting turn...
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as front:
        parent = front.agents.register(PARENT)
        sent = front.send_message(parent, child_id, [TextBlock(text="go on")])
        assert sent.route == "started"
        eventually(
            lambda: front.tasks.get(sent.task_id, requester=parent).waiting_for == "inprocess",
            "the task waits for a runtime with its provider",
        )
        again = front.send_message(parent, child_id, [TextBlock(text="and this too")])
        assert (again.route, again.task_id) == ("steered", sent.task_id)
        assert front.tasks.get(sent.task_id, requester=parent).status is TaskStatus.QUEUED
        # ...and the worker that takes the Task sees both, once, in order.
        worker = reaped.add(LinesProcess(CHILD, store_url, "worker", str(seen), name="worker"))
        done = front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done.outcome
        assert done.outcome is not None
        assert done.outcome.output == "done by the worker"
        worker.expect("SETTLED")
        assert front.store is not None
        turn = _turn(front.store.load(child_id).events, sent.task_id)
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    inbound = [e.data["text"] for e in turn
               if e.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)]  # fmt: skip
    assert inbound == ["go on", "and this too"]
    (call,) = [json.loads(line) for line in seen.read_text().splitlines()]
    assert call[-2:] == ["go on", "and this too"], call


SLOW_SWEEP_LEASE_S = 120.0
"""A lease whose periodic sweep (every third of it) never comes within a test's wait: what
such a runtime takes in time, it took on a wake-up."""


def test_a_closed_runtimes_turn_is_taken_on_a_wake_up_not_at_the_next_sweep(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    with SubagentControl.open(store_url, lease_ttl_s=SLOW_SWEEP_LEASE_S) as survivor:
        survivor.providers.register(InProcessProvider(ScriptedModel(["finished elsewhere"])))
        parent = survivor.agents.register(PARENT)
        closing = reaped.add(LinesProcess(
            CHILD, store_url, "close", str(tmp_path / "runs"), "0", str(SLOW_SWEEP_LEASE_S),
            name="closing",
        ))  # fmt: skip
        ready = json.loads(closing.expect("READY ").removeprefix("READY "))
        closing.say("close")
        closing.expect("CLOSED ")
        done = survivor.tasks.wait(str(ready["task_id"]), timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.runtime_id == survivor.runtime_id
        assert done.recoveries == 1


def test_a_resume_left_for_a_provider_is_taken_on_a_wake_up_not_at_the_next_sweep(
    store_url: str,
) -> None:
    child_id = idle_child(store_url)
    with (
        SubagentControl.open(store_url, lease_ttl_s=SLOW_SWEEP_LEASE_S) as worker,
        SubagentControl.open(store_url, lease_ttl_s=SLOW_SWEEP_LEASE_S) as front,
    ):
        worker.providers.register(InProcessProvider(ScriptedModel(["done by the worker"])))
        parent = front.agents.register(PARENT)
        sent = front.send_message(parent, child_id, [TextBlock(text="go on")])
        assert sent.route == "started"
        done = front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done.outcome
        assert done.runtime_id == worker.runtime_id
