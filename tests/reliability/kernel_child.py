"""A runtime for the kernel-fault tests, run in its own network namespace: one child in a
long tool call, so that its Task runs until the test is done.

Usage: ``python tests/reliability/kernel_child.py URL LEASE_TTL_S``

Prints ``READY <task_id>`` once the tool acts, and ``FENCED`` whenever its lease watchdog
fences it. Then obeys stdin: ``renewed`` prints ``RENEWED <send time>`` of the last renewal
that succeeded (the host's monotonic clock, which every namespace shares), ``status``
prints ``STATUS <the Task's status>``, ``close`` closes and prints ``CLOSED``. A watchdog
ends it after `WATCHDOG_S`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall

WATCHDOG_S = 300.0
_out = threading.Lock()


def say(line: str) -> None:
    with _out:
        print(line, flush=True)


class Fenced(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "lease lost" in record.getMessage():
            say("FENCED")


def main() -> None:
    url, lease = sys.argv[1], float(sys.argv[2])
    threading.Timer(WATCHDOG_S, lambda: os._exit(3)).start()
    logging.getLogger("controlplane.runtime.lease._own_lease").addHandler(Fenced(logging.WARNING))
    acting = threading.Event()

    def work(_args: dict[str, Any], signal: CancelSignal) -> str:
        acting.set()
        signal.wait(WATCHDOG_S)
        return "stopped"

    model = ScriptedModel([ModelReply(tool_calls=[ToolCall(id="w", name="work", arguments={})])])
    tool = ChildTool("work", "Work.", {"type": "object"}, work)
    control = SubagentControl.open(url, lease_ttl_s=lease)
    control.providers.register(InProcessProvider(model, tools=[tool]))
    parent = control.agents.register("kernel-parent")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="long", prompt=[TextBlock(text="go")], parent=parent
        )
    )
    acting.wait(60)
    say(f"READY {started.task_id}")
    renewals = control._runtime.renewals  # type: ignore[union-attr]
    for line in sys.stdin:
        command = line.strip()
        if command == "renewed":
            say(f"RENEWED {renewals.last_renewed}")
        elif command == "status":
            say(f"STATUS {control.tasks.get(started.task_id, requester=parent).status.value}")
        elif command == "close":
            control.close(timeout_s=lease)
            say("CLOSED")
            return
    control.close(timeout_s=lease)


if __name__ == "__main__":
    main()
