"""What the recovery tests start from: a runtime (`recovery_child.py`) SIGKILLed at a given
point of a child's turn, and an idle child whose first turn completed in a runtime closed
since. The process is reaped by the test's ``reaped`` fixture."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from tests.reliability.processes import LinesProcess, Reaper
from tests.reliability.recovery_child import PARENT
from tests.support import WAIT_S

CHILD = Path(__file__).with_name("recovery_child.py")
"""The runtime process the recovery tests start."""


def killed_at(reaped: Reaper, url: str, mode: str, runs: Path, *args: str) -> dict[str, object]:
    """What a runtime said once at ``mode``'s point of a turn (its ``task_id`` and
    ``child_id``); it is SIGKILLed and reaped before this returns. ``args`` are the
    runtime's further arguments (its close timeout, its lease)."""
    runtime = reaped.add(LinesProcess(CHILD, url, mode, str(runs), *args, name=mode))
    ready: dict[str, object] = json.loads(runtime.expect("READY ").removeprefix("READY "))
    runtime.proc.send_signal(signal.SIGKILL)
    runtime.reap()
    return ready


def idle_child(store_url: str) -> str:
    """A child whose first turn completed, in a runtime with its provider (closed since)."""
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as first:
        first.providers.register(InProcessProvider(ScriptedModel(["first turn done"])))
        parent = first.agents.register(PARENT)
        spec = ContinuableStartSpec(
            provider="inprocess", label="idle", prompt=[TextBlock(text="do it")], parent=parent
        )
        started = first.start_continuable(spec)
        done = first.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done.outcome
    return started.child_id
