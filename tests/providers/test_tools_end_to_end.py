"""A child with tools behind the real control plane: stored events, resume, tool filter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.models import (
    ModelReply,
    ToolCall,
)

from .fakes import ONE_TOOL_CALL, UNREPORTED

WAIT_S = 5.0


@pytest.fixture
def control(store_url: str) -> Iterator[SubagentControl]:
    with SubagentControl.open(store_url) as opened:
        yield opened


def test_a_child_calls_a_tool_then_a_resumed_turn_sees_the_exchange_and_its_filter(
    control: SubagentControl,
) -> None:
    tools = [
        ChildTool("lookup", "Look a word up.", {"type": "object"}, lambda a: f"{a['w']}: a mammal"),
        ChildTool("delete_all", "Dangerous.", {"type": "object"}, lambda a: "deleted"),
    ]
    model = ScriptedModel(
        [
            ModelReply(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"w": "otter"})]),
            "an otter is a mammal",
            "yes, a mammal",
        ]
    )
    control.providers.register(InProcessProvider(model, tools=tools))
    parent = control.agents.register("parent-1")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess",
            label="otters",
            prompt=[TextBlock(text="what is an otter?")],
            parent=parent,
            tool_filter={"deny": ["delete_all"]},
        )
    )
    first = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    assert first.status is TaskStatus.COMPLETED
    assert [t.name for t in model.calls[0].tools] == ["lookup"]

    again = control.send_message(parent, started.child_id, [TextBlock(text="sure?")])
    assert again.route == "started"
    second = control.tasks.wait(again.task_id, timeout=WAIT_S, requester=parent)
    assert second.outcome is not None
    assert second.outcome.output == "yes, a mammal"

    resumed = model.calls[2]
    assert [t.name for t in resumed.tools] == ["lookup"]
    assert [(m.role, m.text) for m in resumed.messages] == [
        ("user", "what is an otter?"),
        ("assistant", ""),
        ("tool", "otter: a mammal"),
        ("assistant", "an otter is a mammal"),
        ("user", "sure?"),
    ]
    assert control.store is not None
    events = control.store.load(started.child_id).events
    turn_one = [(e.kind, e.data) for e in events if e.turn == 1][3:-1]
    assert turn_one == [
        (EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 0, **UNREPORTED}),
        ("tool/call", {"id": "c1", "name": "lookup", "arguments": {"w": "otter"}}),
        ("tool/result", {"id": "c1", "output": "otter: a mammal", **ONE_TOOL_CALL}),
        (
            EventKind.ASSISTANT_MESSAGE,
            {"text": "an otter is a mammal", "steering_seen": 0, **UNREPORTED},
        ),
    ]
