"""The budget race's worker: one runtime whose children spend against a shared budget.

Usage: ``python tests/reliability/budget_child.py URL NAME CHILDREN LIMIT``

It opens its own runtime on ``URL`` with a session budget of ``LIMIT`` tokens (every worker
the same), registers the shared parent session and prints ``ready``. On ``go`` (stdin) it
starts ``CHILDREN`` children at once, each a model that calls a tool for ever and spends
`SPEND` tokens per call (so only the budget stops them), waits for every Task and prints
``task <child_id> <status> <code>`` for each, then ``done``. On ``close`` it closes and
prints ``closed``. A watchdog ends it after `WATCHDOG_S` regardless.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    Budget,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
    Usage,
)
from controlplane.models import ModelReply, ToolCall

PARENT = "race-parent"
SPEND = 10
"""Tokens each model call spends."""
WATCHDOG_S = 120.0
WAIT_S = 60.0


def main(url: str, name: str, children: int, limit: int) -> None:
    threading.Timer(WATCHDOG_S, lambda: os._exit(3)).start()
    look = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])
    # A little latency per call, as a server has: the siblings' calls interleave.
    model = ScriptedModel([look], delay_s=0.003, usage=Usage(input_tokens=SPEND))
    tool = ChildTool("look", "Look.", {"type": "object"}, lambda _arguments: "seen")
    with SubagentControl.open(
        url, session_budget=Budget(tokens=limit), max_tool_rounds=None, budget_notice_at=None
    ) as control:
        control.providers.register(InProcessProvider(model, tools=[tool]))
        parent = control.agents.register(PARENT)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        specs = [
            ContinuableStartSpec(
                provider="inprocess",
                label=f"{name}-{n}",
                prompt=[TextBlock(text="go")],
                parent=parent,
            )
            for n in range(children)
        ]
        started = [control.start_continuable(spec) for spec in specs]
        for start in started:
            task = control.tasks.wait(start.task_id, timeout=WAIT_S, requester=parent)
            code = task.outcome.code.value if task.outcome and task.outcome.code else "-"
            print("task", start.child_id, task.status.value, code, flush=True)
        print("done", flush=True)
        sys.stdin.readline()  # close
    print("closed", flush=True)
    os._exit(0)  # the watchdog's timer thread must not hold the exit


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
