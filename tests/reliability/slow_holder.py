"""The forwarding outage tests' holder process: a runtime running one child whose run takes
each steered message only on cue.

Usage: ``python tests/reliability/slow_holder.py URL [BUDGET_S [refuse]]``

It starts one child of ``outage-parent`` whose turn runs until the process is killed, and
prints ``READY <json>`` (the child, its Task, the runtime). For each message steered into
the run it prints ``STEERING`` and waits for a line ``go`` on stdin before the run takes
it (so a test can restart the database while the sender waits for the answer); the
steering record and the answer follow as usual. With ``refuse`` the run refuses it
instead, so the holder answers a refusal. ``BUDGET_S`` is its store's retry budget
(default the store's own). A watchdog ends it after ``WATCHDOG_S``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import ContinuableStartSpec, MessageSource, SubagentControl, TextBlock
from persistence import RetryPolicy
from tests.fakes import FakeProvider
from tests.support import wait_published

PARENT = "outage-parent"
WATCHDOG_S = 60.0


def main(url: str, budget_s: float | None, refuse: bool) -> None:
    retry = RetryPolicy() if budget_s is None else RetryPolicy(max_total_s=budget_s)
    control = SubagentControl.open(url, retry=retry)
    provider = FakeProvider()
    control.providers.register(provider)
    parent = control.agents.register(PARENT)
    plan = provider.plan(result_gate=threading.Event())  # never opened: runs until killed
    started = control.start_continuable(
        ContinuableStartSpec(
            provider=provider.name, label="held", parent=parent, prompt=[TextBlock(text="go")]
        )
    )
    assert plan.returned.wait(WATCHDOG_S)
    wait_published(control, started.child_id)
    cue = threading.Event()

    def read_cues() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                cue.set()

    threading.Thread(target=read_cues, daemon=True).start()
    assert plan.run is not None
    assert plan.run.steer is not None
    take = plan.run.steer

    def steer(message: Sequence[TextBlock], source: MessageSource) -> None:
        print("STEERING", flush=True)
        cue.wait(WATCHDOG_S)
        if refuse:
            raise RuntimeError("the run refused it (on purpose)")
        take(message, source)

    plan.run.steer = steer
    ready = {
        "runtime_id": control.runtime_id,
        "child_id": started.child_id,
        "task_id": started.task_id,
    }
    print("READY " + json.dumps(ready), flush=True)
    threading.Event().wait(WATCHDOG_S)
    os._exit(3)  # the watchdog: the test never killed it


if __name__ == "__main__":
    main(
        sys.argv[1],
        float(sys.argv[2]) if len(sys.argv) > 2 else None,
        sys.argv[3:] == ["refuse"],
    )
