"""The claim tests' sender process: one runtime that sends to one shared child on cue.

Usage: ``python tests/reliability/claim_child.py URL CHILD_ID NAME``

For each line ``go <round>`` on stdin it sends ``<NAME>-<round>`` to the child and prints
one line: ``started <task_id>``, ``steered <task_id>`` or ``refused <CODE>``; a started
Task is waited for (its turn takes a few milliseconds, so the senders' turns overlap in
time) and ``settled <status>`` printed. ``quit`` (or end of input) closes the runtime. A
watchdog ends it after ``WATCHDOG_S`` regardless.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import SubagentControl, SubagentControlError, TextBlock
from tests.fakes import FakeProvider

PARENT = "claim-parent"
WATCHDOG_S = 90.0
TURN_S = 0.02
LEASE_TTL_S = 30.0


def main(url: str, child_id: str, name: str) -> None:
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    # No test stops or kills a sender, so nothing waits for its lease to lapse; a short one
    # would let a heartbeat late under load (0.78 s apart, measured, where a 1 s lease
    # lapses past 1 s) make it dead to the others mid-turn, and its child be taken over.
    control = SubagentControl.open(url, lease_ttl_s=LEASE_TTL_S, close_timeout_s=5.0)
    provider = FakeProvider()
    control.providers.register(provider)
    parent = control.agents.register(PARENT)
    print(f"ready {control.runtime_id}", flush=True)
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            break
        gate = threading.Event()
        provider.default_plan(result_gate=gate)
        opener = threading.Timer(TURN_S, gate.set)  # the turn lasts a little while
        opener.daemon = True
        opener.start()
        text = f"{name}-{arg}"
        try:
            sent = control.send_message(parent, child_id, [TextBlock(text=text)])
        except SubagentControlError as exc:
            print(f"refused {exc.code.value}", flush=True)
            continue
        print(f"{sent.route} {sent.task_id}", flush=True)
        if sent.route == "started":
            snapshot = control.tasks.wait(sent.task_id, timeout=30.0, requester=parent)
            print(f"settled {snapshot.status.value}", flush=True)
    control.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
