"""A send of a runtime's own that claims a child right after that runtime's takeover of the
child's Task committed, before the Task is started here: it must be refused
(``NOT_DELIVERED``, the Task is carried on here) and the Task go on to ``completed``, not
be settled ``interrupted`` as a stale Task of this runtime's own.

Two takeovers: a dead runtime's running Task (recovery; the runtime that dies is a process,
SIGKILLed and reaped) and a Task left for a runtime with its child's provider. The send is
made inside the window on purpose: the store call that takes the Task over is wrapped so
that, once it has returned (its transaction committed: the claim names this runtime and the
Task), a send runs to its answer before the takeover goes on. SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.reliability.processes import Reaper, reaping
from tests.reliability.recovery_child import PARENT, work_tool
from tests.reliability.recovery_setup import idle_child, killed_at
from tests.support import WAIT_S, eventually

LEASE_S = 30.0
"""Long: no sweep of its own comes in; the first send wakes the one that recovers."""

pytestmark = [pytest.mark.timeout(120)]

reaped = pytest.fixture(reaping, name="reaped")


def test_a_send_between_the_recoverys_claim_and_the_tasks_start_does_not_end_the_task(
    reaped: Reaper, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs.jsonl"
    with SubagentControl.open(store_url, lease_ttl_s=LEASE_S) as control:
        assert control.store is not None
        control.providers.register(
            InProcessProvider(ScriptedModel(["finished after recovery"]), tools=[work_tool(runs)])
        )
        parent = control.agents.register(PARENT)
        ready = killed_at(reaped, store_url, "model", runs, "30", str(LEASE_S))
        task_id, child_id = str(ready["task_id"]), str(ready["child_id"])

        def send() -> str:
            return _send(control, parent, child_id, "in the window")

        recover = control.store.recover
        in_window: list[str] = []
        sent_in_window = threading.Event()

        def recover_then_send(*args: Any, **kwargs: Any) -> Any:
            result = recover(*args, **kwargs)  # committed: the claim is this runtime's now
            if result.fence is not None and not sent_in_window.is_set():
                sender = threading.Thread(target=lambda: in_window.append(send()))
                sender.start()
                sender.join(WAIT_S)
                sent_in_window.set()
            return result

        monkeypatch.setattr(control.store, "recover", recover_then_send)
        first = send()  # refused; it wakes the sweep that recovers the Task
        assert first.startswith(f"refused {ErrorCode.NOT_DELIVERED.value}: "), first
        assert sent_in_window.wait(WAIT_S), "the Task was not recovered"

        # Before the fix: `started` with a new Task, and the recovered one interrupted.
        assert len(in_window) == 1, in_window
        assert in_window[0].startswith(f"refused {ErrorCode.NOT_DELIVERED.value}: "), in_window
        assert "carried on here" in in_window[0], in_window
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.recoveries == 1


def test_a_send_between_a_waiting_tasks_take_and_its_start_does_not_end_the_task(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same window for a Task that waited for a runtime with its child's provider: the
    # runtime that has it takes the Task (the claim is its own now), then starts it.
    child_id = idle_child(store_url)
    with (
        SubagentControl.open(store_url, lease_ttl_s=LEASE_S) as front,
        SubagentControl.open(store_url, lease_ttl_s=LEASE_S) as worker,
    ):
        parent = front.agents.register(PARENT)
        waiting = front.send_message(parent, child_id, [TextBlock(text="go on")])
        assert waiting.route == "started"  # left for a runtime with the provider
        assert front.store is not None
        store = front.store
        # Left for it in the store: on SQLite nothing wakes a runtime for it, so a sweep
        # before this finds nothing, and the next comes a third of a lease later.
        eventually(
            lambda: getattr(store.ledger.get(waiting.task_id), "waiting_for", None) is not None,
            "the Task left for a runtime with the provider",
        )
        assert worker.store is not None
        worker_parent = worker.agents.register(PARENT)
        take_waiting = worker.store.take_waiting
        in_window: list[str] = []
        sent_in_window = threading.Event()

        def take_then_send(*args: Any, **kwargs: Any) -> Any:
            fence = take_waiting(*args, **kwargs)  # committed: the claim is the worker's
            if fence is not None and not sent_in_window.is_set():
                sender = threading.Thread(
                    target=lambda: in_window.append(
                        _send(worker, worker_parent, child_id, "in the window")
                    )
                )
                sender.start()
                sender.join(WAIT_S)
                sent_in_window.set()
            return fence

        monkeypatch.setattr(worker.store, "take_waiting", take_then_send)
        worker.providers.register(InProcessProvider(ScriptedModel(["done by the worker"])))
        assert sent_in_window.wait(WAIT_S), "the waiting Task was not taken"

        # Before the fix: `started` with a new Task, and the waiting one interrupted.
        assert len(in_window) == 1, in_window
        assert in_window[0].startswith(f"refused {ErrorCode.NOT_DELIVERED.value}: "), in_window
        done = front.tasks.wait(waiting.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done.outcome
        assert done.runtime_id == worker.runtime_id


def _send(control: SubagentControl, parent: AgentHandle, child_id: str, text: str) -> str:
    """What a send was told: its route and Task, or its refusal."""
    try:
        sent = control.send_message(parent, child_id, [TextBlock(text=text)])
    except SubagentControlError as exc:
        return f"refused {exc.code.value}: {exc.message}"
    return f"{sent.route} {sent.task_id}"


def test_a_carried_task_stays_carried_after_the_order_until_its_activation_runs_here() -> None:
    # The order to the child's supervisor can wait in its mailbox behind a send whose claim
    # comes after the takeover's store call returned: that claim, finding the Task in this
    # runtime's claim, must still take it for carried on (seen in the recovery stress run:
    # the recovering runtime settled the Task it was carrying on `interrupted`, "lost its
    # lease or the store before it could record the task's end").
    from controlplane.runtime.lease._recovery import Recovery

    class Runtime:
        lease_ttl_s = 30.0

    running: set[str] = set()
    recovery = Recovery(None, Runtime(), None, enabled=True, max_recoveries=3)  # type: ignore[arg-type]
    recovery.start(lambda *_: None, runs_here=running.__contains__)
    with recovery._carrying_task("task-1"):
        assert recovery.carrying("task-1")
    assert recovery.carrying("task-1")  # ordered, not yet running here
    running.add("task-1")
    assert recovery.carrying("task-1")  # running here
    assert not recovery.carrying("task-2")


def test_a_carried_task_that_never_runs_here_is_stale_again_after_a_lease() -> None:
    from controlplane.runtime.lease._recovery import Recovery

    class Runtime:
        lease_ttl_s = 0.0  # the mark lapses at once: what a lease later looks like

    recovery = Recovery(None, Runtime(), None, enabled=True, max_recoveries=3)  # type: ignore[arg-type]
    recovery.start(lambda *_: None, runs_here=lambda _task_id: False)
    with recovery._carrying_task("task-1"):
        assert recovery.carrying("task-1")
    assert not recovery.carrying("task-1")
