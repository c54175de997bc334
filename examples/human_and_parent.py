"""A parent model (through tool calls) and a watching human message the same child.

Run it with:  python examples/human_and_parent.py

The parent model drives the child with the built-in tools (`subagent`, `send_message`,
`task_output`, `list_agents`); a human watching the parent types into the same child through
`HumanInput`. Both messages join one turn, share its result, and land in the child's
transcript with their sources (`coordinator` and `human`).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from controlplane import (
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControl,
)
from controlplane.tools import HumanInput, ToolHandlers


def main() -> None:
    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'state.db'}"
    # A gated model: each reply waits until we release it, so messages arrive mid-turn.
    model = ScriptedModel(echo=True, gated=True)
    with SubagentControl.open(url) as control:
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register("parent-1", model=ModelSelector(provider="p", model="m"))
        tools = ToolHandlers(control, parent)
        human = HumanInput(control, parent)

        def tool(name: str, **arguments: object) -> str:
            result = tools.call(name, arguments)
            print(f"model  > {name}({arguments or ''})\n       < {result.text}")
            return result.text

        started = tool("subagent", description="release notes", prompt="draft the release notes")
        match = re.search(r"subagent (\S+) as task (\S+)", started)
        assert match is not None
        child_id, task_id = match.groups()
        model.wait_for_calls(1)

        sent = human.send(child_id, "mention the crash fix", sender_id="alice")
        print("human  > alice: 'mention the crash fix'")
        print(f"       < {sent.route} into task {sent.task_id[:8]}")
        tool("send_message", subagent_id=child_id, message="keep it under 100 words")
        tool("list_agents")

        model.release(10)
        tool("task_output", task_id=task_id, wait=True, timeout_s=10)
        for notice in tools.drain_notices():
            print(f"notice : {notice}")

        print("\nthe child's transcript (one turn, both senders):")
        assert control.store is not None
        for event in control.store.load(child_id).events:
            if event.source is None:
                continue
            who = event.source.kind + (
                f"/{event.source.sender_session_id}" if event.source.sender_session_id else ""
            )
            print(f"  turn {event.turn}  {event.kind:<18} {who:<22} {event.data.get('text', '')}")


if __name__ == "__main__":
    main()
