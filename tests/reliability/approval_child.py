"""A runtime whose child asks for approval, for `test_approval_processes.py`: it starts a
child whose ``deploy`` tool needs approval, waits until the Task reads ``input_required``,
drains the parent's notices, prints ``READY {json}`` and waits to be SIGKILLed (bounded:
it exits by itself after a minute).

Args: store URL, the file the tool appends a line to each time it runs, the grace period,
and (optional) a state directory: then the child is an ACP agent asking permission.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from controlplane import (
    AcpProvider,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall

LIFETIME_S = 60.0
DEPLOY = ModelReply(tool_calls=[ToolCall(id="c1", name="deploy", arguments={"env": "prod"})])


def deploy_tool(runs: Path) -> ChildTool:
    """The ``deploy`` tool every runtime of the test registers: it logs each run."""

    def run(arguments: dict[str, str]) -> str:
        with runs.open("a", encoding="utf-8") as log:
            log.write(json.dumps(arguments) + "\n")
        return f"deployed {arguments['env']}"

    return ChildTool("deploy", "Deploy.", {"type": "object"}, run, approval="always")


def main(url: str, runs: str, grace_s: str, acp_state: str = "") -> None:
    control = SubagentControl.open(url, lease_ttl_s=30.0, approval_grace_s=float(grace_s))
    provider = "inprocess"
    if acp_state:  # an ACP agent that asks permission, answered through the parent
        agent = Path(__file__).parents[1] / "providers" / "acp_agent.py"
        command = [sys.executable, str(agent), "--state", acp_state, "--ask-permission"]
        control.providers.register(AcpProvider(command, permission="ask", grace_s=1.0))
        provider = "acp"
    else:
        model = ScriptedModel([DEPLOY, "never reached here"])
        control.providers.register(InProcessProvider(model, tools=[deploy_tool(Path(runs))]))
    parent = control.agents.register("approver")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider=provider, label="ship", prompt=[TextBlock(text="ship")], parent=parent
        )
    )
    waiting = control.tasks.wait(started.task_id, timeout=LIFETIME_S, requester=parent)
    assert waiting.status is TaskStatus.INPUT_REQUIRED
    assert waiting.request is not None
    notices = [n.summary for n in control.tasks.drain_notices(parent)]
    if float(grace_s) < 1:  # let the run park before the kill
        deadline = time.monotonic() + LIFETIME_S
        while time.monotonic() < deadline and any(
            t.name.startswith("subagent-loop") for t in threading.enumerate()
        ):
            time.sleep(0.01)
    ready = {
        "task_id": started.task_id,
        "child_id": started.child_id,
        "request_id": waiting.request.id,
        "notices": notices,
    }
    print("READY " + json.dumps(ready), flush=True)
    threading.Event().wait(LIFETIME_S)


if __name__ == "__main__":
    main(*sys.argv[1:5])
