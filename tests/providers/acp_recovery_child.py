"""A runtime whose ACP child's prompt is caught mid-way, for `test_acp_recovery.py`.

``python acp_recovery_child.py URL MODE HOLD AGENT_COMMAND...``: opens a control plane on
the store, registers an `AcpProvider` running ``AGENT_COMMAND`` (an agent that hangs in its
prompt while the file ``HOLD`` exists), starts a child, prints ``READY {json}`` (the Task,
the child, this runtime) once the child is in the store, and waits (bounded: it exits by
itself after a minute) to be SIGKILLed.

Modes:
- ``start``: the child's first prompt (``work``) is the one caught; the test makes ``HOLD``.
- ``resumed``: the first turn (``first``) completes, then this creates ``HOLD`` and a
  message (``second``) resumes the child (``started``): that turn's prompt is caught.
- ``steered``: like ``start``, then on a line on its stdin it steers the running turn
  (``also this``) and prints ``STEERED <route>``.
- ``close``: like ``start``, then on a line on its stdin it closes (handing the turn over,
  or killing it when the agent cannot reopen its session) and prints ``CLOSED <seconds>``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    AcpProvider,
    ContinuableStartSpec,
    SubagentControl,
    TaskStatus,
    TextBlock,
)

LIFETIME_S = 60.0
PARENT = "acp-recovery-parent"


def main(url: str, mode: str, hold: str, *command: str) -> None:
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    control.providers.register(AcpProvider(list(command), grace_s=0.5, start_timeout_s=30.0))
    parent = control.agents.register(PARENT)
    prompt = "first" if mode == "resumed" else "work"
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="acp", label="acp child", prompt=[TextBlock(text=prompt)], parent=parent
        )
    )
    task_id = started.task_id
    if mode == "resumed":
        done = control.tasks.wait(task_id, timeout=LIFETIME_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        Path(hold).touch()
        sent = control.send_message(parent, started.child_id, [TextBlock(text="second")])
        assert sent.route == "started", sent
        task_id = sent.task_id
    assert control.store is not None
    deadline = time.monotonic() + LIFETIME_S
    while not control.store.list_children(PARENT):  # published: a recovery has it to go on
        if time.monotonic() > deadline:
            raise SystemExit("the child was never published")
        time.sleep(0.01)
    ready = {"task_id": task_id, "child_id": started.child_id, "runtime_id": control.runtime_id}
    print("READY " + json.dumps(ready), flush=True)
    if mode == "steered":
        sys.stdin.readline()  # the agent has the prompt
        sent = control.send_message(parent, started.child_id, [TextBlock(text="also this")])
        print(f"STEERED {sent.route}", flush=True)
    if mode == "close":
        sys.stdin.readline()  # the test's runtime is up
        began = time.monotonic()
        control.close()
        print(f"CLOSED {time.monotonic() - began:.3f}", flush=True)
        return
    threading.Event().wait(LIFETIME_S)


if __name__ == "__main__":
    main(*sys.argv[1:])
