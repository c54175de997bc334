"""The restart tests' child process: a runtime with one finished and one running Task.

Usage: ``python tests/reliability/restart_child.py URL LEASE_TTL_S [steer]``

It starts two children of ``restart-parent``: one whose turn completes, and one whose turn
runs until the process is killed. Once the first Task has settled and the second is
published it prints one line ``READY <json>`` (the ids) and waits to be killed (SIGKILL) or
stopped (SIGSTOP). With ``steer`` it steers the running child meanwhile, one message per
round, printing ``ok <text> <route>`` or ``refused <CODE> <text>`` for each (the zombie test:
once another runtime took the child over, every write of this one to that turn must be
refused; once that runtime's turn is over and this one renews again, it may resume the child
itself, route ``started``). A watchdog ends it after ``WATCHDOG_S`` regardless.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import ContinuableStartSpec, SubagentControl, SubagentControlError, TextBlock
from tests.fakes import FakeProvider
from tests.support import wait_published

PARENT = "restart-parent"
WATCHDOG_S = 60.0


def main(url: str, lease_ttl_s: float, steer: bool) -> None:
    control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s)
    provider = FakeProvider()
    control.providers.register(provider)
    parent = control.agents.register(PARENT)

    def start(label: str) -> tuple[str, str]:
        started = control.start_continuable(
            ContinuableStartSpec(
                provider=provider.name,
                label=label,
                parent=parent,
                prompt=[TextBlock(text=f"{label}, please")],
            )
        )
        return started.child_id, started.task_id

    done_child, done_task = start("finished one")
    control.tasks.wait(done_task, timeout=10.0, requester=parent)
    provider.plan(result_gate=threading.Event())  # never opened: runs until killed
    running_child, running_task = start("running one")
    wait_published(control, running_child)
    ready = {
        "runtime_id": control.runtime_id,
        "done_child": done_child,
        "done_task": done_task,
        "running_child": running_child,
        "running_task": running_task,
    }
    print("READY " + json.dumps(ready), flush=True)
    pause = threading.Event()
    for number in range(int(WATCHDOG_S / 0.01)):
        if steer:
            text = f"zombie-{number}"
            try:
                sent = control.send_message(parent, running_child, [TextBlock(text=text)])
                print(f"ok {text} {sent.route}", flush=True)
            except SubagentControlError as exc:
                print(f"refused {exc.code.value} {text}", flush=True)
        pause.wait(0.01)
    sys.exit(3)  # the watchdog: the test never killed it


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3:] == ["steer"])
