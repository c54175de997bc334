"""A message to the child of a runtime that died mid-turn, sent before any sweep carried the
Task on (recovery): the runtime that claims the child, and has its provider, must
carry the SAME Task on, not settle it ``interrupted`` and start a new one.

Found by the recovery stress run (`test_recovery_stress.py`): five Tasks of SIGKILLed
runtimes read ``interrupted`` ("its runtime … ended before the task settled (taken over by
runtime …)") although recovery was on and every runtime had the provider, because a send
reached the claim before the sweep did. SQLite and PostgreSQL; the process is reaped.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.reliability.processes import Reaper, reaping
from tests.reliability.recovery_child import PARENT, work_tool
from tests.reliability.recovery_setup import killed_at
from tests.support import WAIT_S

LEASE_S = 30.0
"""Long: the sweep (every third of it) does not come between the death and the send."""
TRIES = 200

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")


def test_a_send_to_a_dead_runtimes_child_before_the_sweep_steers_the_same_task_on(
    reaped: Reaper, store_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.jsonl"
    with SubagentControl.open(store_url, lease_ttl_s=LEASE_S) as control:
        model = ScriptedModel(["finished after recovery"])
        control.providers.register(InProcessProvider(model, tools=[work_tool(runs)]))
        parent = control.agents.register(PARENT)
        # Mid model call in another runtime, then SIGKILLed: its pid is gone, so it is dead
        # at once; this runtime's next sweep is a third of a lease away.
        ready = killed_at(reaped, store_url, "model", runs, "30", str(LEASE_S))
        task_id, child_id = str(ready["task_id"]), str(ready["child_id"])

        outcomes: list[str] = []
        for _ in range(TRIES):  # a caller's retries, bounded in count
            try:
                sent = control.send_message(parent, child_id, [TextBlock(text="and this")])
            except SubagentControlError as exc:
                outcomes.append(f"refused {exc.code.value}: {exc.message}")
                time.sleep(0.05)  # a caller's retry pace, not a synchronisation
                continue
            outcomes.append(sent.route)
            break
        # Before the fix: `started` at once, a new Task, the dead runtime's interrupted.
        # Now refused until the Task goes on here, then steered into it (or, if the
        # recovered turn already ended, a new turn after it).
        assert outcomes[0].startswith(f"refused {ErrorCode.NOT_DELIVERED.value}: "), outcomes
        assert "carried on here" in outcomes[0], outcomes[0]
        nd = f"refused {ErrorCode.NOT_DELIVERED.value}: "
        assert all(o.startswith(nd) for o in outcomes[:-1]), outcomes  # a retry's refusals
        assert outcomes[-1] in ("steered", "started"), outcomes
        if outcomes[-1] == "steered":
            assert sent.task_id == task_id
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.recoveries == 1
        control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(child_id).events
    opened = [e.data["task_id"] for e in events if e.kind == EventKind.TURN_START]
    assert opened == ([task_id] if sent.task_id == task_id else [task_id, sent.task_id])
    ends = [e.data["status"] for e in events if e.kind == EventKind.TURN_END]
    assert ends == ["completed"] * len(opened)
    inbound = [
        e.data["text"]
        for e in events
        if e.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
    ]
    assert inbound.count("and this") == 1, inbound
