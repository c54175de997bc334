"""The runtime in another process that the CLI's verbs act on: one child whose turn waits
in its model call, and one idle child whose first turn completed.

Usage: ``act_holder.py URL``. Prints ``idle <child_id>``, then ``running <child_id>
<task_id>``; on ``release`` (stdin) lets the waiting model call (and the next few)
answer; prints ``settled <status>`` once the running Task settled; serves until stdin
closes.
"""

from __future__ import annotations

import sys
import threading

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)

WAIT_S = 60.0


def main(url: str) -> None:
    with SubagentControl.open(url) as control:
        idle_model = ScriptedModel(["idle answer"])
        control.providers.register(InProcessProvider(idle_model, name="idle"))
        held = ScriptedModel(["held answer"], gated=True)
        control.providers.register(InProcessProvider(held, name="held"))
        parent = control.agents.register("act-parent")

        def start(provider: str, label: str) -> tuple[str, str]:
            spec = ContinuableStartSpec(
                provider=provider, label=label, prompt=[TextBlock(text=label)], parent=parent
            )
            started = control.start_continuable(spec)
            return started.child_id, started.task_id

        idle_child, idle_task = start("idle", "idle one")
        control.tasks.wait(idle_task, timeout=WAIT_S, requester=parent)
        print(f"idle {idle_child}", flush=True)
        child_id, task_id = start("held", "held one")
        if not held.wait_for_calls(1, WAIT_S):
            raise SystemExit("the model was never called")
        print(f"running {child_id} {task_id}", flush=True)

        def report() -> None:
            settled = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
            print(f"settled {settled.status.value}", flush=True)

        reporter = threading.Thread(target=report, name="report")
        reporter.start()
        for line in sys.stdin:  # until the test closes stdin
            if line.strip() == "release":
                held.release(5)  # the held call, and those after a steer
        reporter.join(WAIT_S)


if __name__ == "__main__":
    main(sys.argv[1])
