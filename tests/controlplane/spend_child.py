"""A runtime killed mid-turn, for `test_sweep_spend.py`: it starts a priced child whose
first model call is written and whose tool then blocks, prints ``READY {json}`` and waits
to be SIGKILLed (bounded: it exits by itself after a minute)."""

from __future__ import annotations

import json
import sys
import threading
import time

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    Price,
    ScriptedModel,
    SubagentControl,
    TextBlock,
    Usage,
)
from controlplane.models import ModelReply, ToolCall

LIFETIME_S = 60.0


def main(url: str) -> None:
    blocked = threading.Event()
    control = SubagentControl.open(
        url, lease_ttl_s=30.0, prices={"m": Price(input=1_000_000, output=2_000_000)}
    )
    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCall(id="c1", name="stall", arguments={})]), "never"],
        usage=[Usage(input_tokens=10, output_tokens=2), Usage(input_tokens=1)],
    )
    stall = ChildTool(
        "stall", "Stall.", {"type": "object"}, lambda _a: str(blocked.wait(LIFETIME_S))
    )
    control.providers.register(InProcessProvider(model, tools=[stall]))
    parent = control.agents.register("sweep-parent")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="stalls", prompt=[TextBlock(text="go")], parent=parent,
            agent_model="m",
        )
    )  # fmt: skip
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        if control.tasks.get(started.task_id, requester=parent).usage.model_calls == 1:
            break
        time.sleep(0.01)
    ready = {"task_id": started.task_id, "child_id": started.child_id}
    print("READY " + json.dumps(ready), flush=True)
    blocked.wait(LIFETIME_S)


if __name__ == "__main__":
    main(sys.argv[1])
