"""A harness process for the console's tests: its runtime runs children the console shows.

``python tests/console/harness.py URL RUNS_FILE MODE`` starts one child under parent
``harness`` and prints ``READY {json}`` (child, task, request ids), then serves until its
stdin closes or says ``quit`` (bounded: it exits by itself after `LIFETIME_S`).

Modes:
- ``approval``: the child's model calls ``deploy``, a tool that needs approval (its run
  waits holding its thread, so a message sent meanwhile steers the same turn); each run of
  the tool appends a line to RUNS_FILE; once answered, the model says ``shipped``.
- ``slow``: the child's turn runs a tool that waits (for a kill) up to `LIFETIME_S`.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall

LIFETIME_S = 90.0


def deploy_tool(runs: Path) -> ChildTool:
    """``deploy``: needs approval; logs each run."""

    def run(arguments: dict[str, Any]) -> str:
        with runs.open("a", encoding="utf-8") as log:
            log.write(json.dumps(arguments) + "\n")
        return f"deployed {arguments['env']}"

    schema = {"type": "object", "properties": {"env": {"type": "string"}}}
    return ChildTool("deploy", "Deploy a service.", schema, run, approval="always")


def wait_tool() -> ChildTool:
    """``wait``: blocks until its run is cancelled (a kill), bounded."""

    def run(arguments: dict[str, Any], signal: Any) -> str:
        signal.wait(LIFETIME_S)
        return "waited"

    return ChildTool("wait", "Wait.", {"type": "object"}, run)


def main(url: str, runs: str, mode: str) -> None:
    control = SubagentControl.open(url, approval_grace_s=LIFETIME_S)
    try:
        if mode == "approval":
            call = ToolCall(id="c1", name="deploy", arguments={"env": "prod"})
            model = ScriptedModel(
                [ModelReply(text="shipping to prod", tool_calls=[call]), "shipped"]
            )
            tools = [deploy_tool(Path(runs))]
        else:
            call = ToolCall(id="w1", name="wait", arguments={})
            model = ScriptedModel([ModelReply(tool_calls=[call]), "never"])
            tools = [wait_tool()]
        control.providers.register(InProcessProvider(model, tools=tools))
        parent = control.agents.register("harness")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label=f"{mode} job",
                parent=parent,
                prompt=[TextBlock(text=f"do the {mode} job")],
            )
        )
        ready: dict[str, Any] = {"child_id": started.child_id, "task_id": started.task_id}
        if mode == "approval":
            waiting = control.tasks.wait(started.task_id, timeout=LIFETIME_S, requester=parent)
            assert waiting.status is TaskStatus.INPUT_REQUIRED, waiting
            assert waiting.request is not None
            ready["request_id"] = waiting.request.id
        print("READY " + json.dumps(ready), flush=True)
        done = threading.Event()

        def watch_stdin() -> None:
            for line in sys.stdin:
                if line.strip() == "quit":
                    break
            done.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
        done.wait(LIFETIME_S)
    finally:
        control.close(timeout_s=10.0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
