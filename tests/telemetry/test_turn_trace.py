"""One turn's trace is one tree: a start under the harness's tool call, the activation
under it, and under the activation its phases, each model call (``chat {model}``) and
each tool call (``execute_tool {name}``, with what the tool's handler traces under it); a
steer from another thread links its send to the activation, and the kill is a span too.
Exported by the SDK's in-memory exporter."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ChildTool,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
)
from controlplane.contract import Usage
from controlplane.models import ModelReply, ToolCall
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually, in_thread, settle, start_child, text
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(60)


def _tree(otel: Otel, trace_id: int) -> tuple[Any, dict[int, list[Any]]]:
    """The one root of trace ``trace_id``'s exported spans, each of which has its parent
    among them, and each span's children by span id."""
    spans = [s for s in otel.spans() if s.context.trace_id == trace_id]
    ids = {s.context.span_id for s in spans}
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1, sorted(s.name for s in roots)
    assert all(s.parent is None or s.parent.span_id in ids for s in spans)
    children: dict[int, list[Any]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    return roots[0], children


def _names(children: dict[int, list[Any]], span: Any) -> list[str]:
    return sorted(s.name for s in children.get(span.context.span_id, []))


def test_a_turn_with_a_tool_call_a_steer_and_a_kill_is_one_tree(
    control: SubagentControl, parent: AgentHandle, otel: Otel
) -> None:
    harness = otel.tracer_provider.get_tracer("harness")
    tool_ran = threading.Event()

    def lookup(arguments: dict[str, Any]) -> str:
        # A span the tool's own code opens: under its execute_tool span, not a new trace.
        with harness.start_as_current_span("lookup work"):
            tool_ran.set()
        return f"{arguments['w']}: a mammal"

    model = ScriptedModel(
        [
            ModelReply(
                tool_calls=[ToolCall(id="c1", name="lookup", arguments={"w": "otter"})],
                usage=Usage(input_tokens=12, output_tokens=3),
            ),
            "an otter is a mammal",
        ],
        gated=True,
    )
    tools = [ChildTool("lookup", "Look a word up.", {"type": "object"}, lookup)]
    control.providers.register(InProcessProvider(model, tools=tools))

    with harness.start_as_current_span("tool subagent") as tool_call:
        started = start_child(control, parent, provider="inprocess", prompt="otters?")
        model.release()  # the first call answers with the tool call
        assert tool_ran.wait(WAIT_S)
        assert model.wait_for_calls(2, WAIT_S)  # the second call waits, gated
        # A steer from another thread, under a span of its own (another trace's root).
        steered = in_thread(
            lambda: control.send_message(parent, started.child_id, text("also beavers"))
        ).result(WAIT_S)
        control.tasks.kill(started.task_id, requester=parent)
    settled = settle(control, started.task_id, parent)
    assert steered.route == "steered"
    assert settled.status is TaskStatus.KILLED

    root, children = _tree(otel, tool_call.get_span_context().trace_id)
    assert root.name == "tool subagent"
    assert root.context.span_id == tool_call.get_span_context().span_id
    assert _names(children, root) == ["subagent.kill", "subagent.start"]
    (start,) = otel.spans("subagent.start")
    (activation,) = otel.spans("subagent.activation")
    assert activation.parent.span_id == start.context.span_id
    assert _names(children, activation) == [
        "chat m1",
        "chat m1",
        "execute_tool lookup",
        "subagent.dispose",
        "subagent.provider.start",
        "subagent.publish",
    ]
    (tool_span,) = otel.spans("execute_tool lookup")
    assert _names(children, tool_span) == ["lookup work"]
    assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup"

    first, second = sorted(otel.spans("chat m1"), key=lambda s: s.start_time)
    assert first.kind.name == "CLIENT"
    assert dict(first.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m1",
        "gen_ai.provider.name": "acme",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
    }
    # The call the kill interrupted: one error.type across the trace, the Task's code.
    assert second.status.status_code.name == "ERROR"
    assert second.attributes["error.type"] == "CANCELLED"
    assert activation.attributes["error.type"] == "CANCELLED"
    assert first.start_time < tool_span.start_time < second.start_time

    # The steer: its send is a span of the other thread (not in the tree: it was sent
    # under no span), linked to the activation, and the activation names it.
    (send,) = otel.spans("subagent.send")
    assert send.parent is None
    assert [s.name for s in otel.spans() if s.context.trace_id == send.context.trace_id] == [
        "subagent.send"
    ]
    assert [link.context.span_id for link in send.links] == [activation.context.span_id]
    (event,) = [e for e in activation.events if e.name == "subagent.steered"]
    assert event.attributes["subagent.send.span_id"] == format(send.context.span_id, "016x")
    (kill,) = otel.spans("subagent.kill")
    assert kill.attributes["subagent.task.id"] == started.task_id


HOLDER = Path(__file__).with_name("trace_holder.py")
reaped = pytest.fixture(reaping, name="reaped")


@pytest.mark.postgres
@pytest.mark.slow
def test_a_steer_and_a_kill_forwarded_to_another_process_continue_the_sender_s_trace(
    pg_url: str, otel: Otel, reaped: Reaper
) -> None:
    holder = reaped.add(LinesProcess(HOLDER, pg_url, name="trace holder"))
    child_id, task_id = holder.expect("running ").split()
    control = SubagentControl.open(pg_url, tracer_provider=otel.tracer_provider)
    try:
        parent = control.agents.register("trace-parent")
        harness = otel.tracer_provider.get_tracer("harness")
        with harness.start_as_current_span("tool send_message") as steer_call:
            steered = control.send_message(parent, child_id, text("also beavers"))
        with harness.start_as_current_span("tool task_kill") as kill_call:
            control.tasks.kill(task_id, requester=parent)
    finally:
        control.close()
    assert steered.route == "steered"
    assert steered.task_id == task_id
    assert holder.expect("settled ") == "killed"
    spans = []
    while (line := holder.next_line()) != "end":
        assert line.startswith("span "), line
        spans.append(json.loads(line.removeprefix("span ")))

    def there(name: str, **attributes: Any) -> dict[str, Any]:
        found = [
            s
            for s in spans
            if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attributes.items())
        ]
        assert len(found) == 1, (name, attributes, [s["name"] for s in spans])
        return found[0]

    (send,) = otel.spans("subagent.send")
    (kill,) = otel.spans("subagent.kill")
    assert send.parent.span_id == steer_call.get_span_context().span_id
    assert kill.parent.span_id == kill_call.get_span_context().span_id
    activation = there("subagent.activation")
    delivered = there("subagent.deliver", **{"subagent.forwarded.kind": "send"})
    killed = there("subagent.deliver", **{"subagent.forwarded.kind": "kill"})
    # The holder's delivery spans continue the sender's traces, each under its span...
    assert delivered["trace_id"] == format(send.context.trace_id, "032x")
    assert delivered["parent_id"] == format(send.context.span_id, "016x")
    assert killed["trace_id"] == format(kill.context.trace_id, "032x")
    assert killed["parent_id"] == format(kill.context.span_id, "016x")
    # ...the steer's links to the activation, which names it in its event.
    assert delivered["links"] == [activation["span_id"]]
    (event,) = [e for e in activation["events"] if e["name"] == "subagent.steered"]
    assert event["attributes"]["subagent.send.span_id"] == delivered["span_id"]
    # The activation's own tree, in the holder: the model call under it, killed.
    (call,) = [s for s in spans if s["name"] == "chat m1"]
    assert call["parent_id"] == activation["span_id"]
    assert call["attributes"]["error.type"] == activation["attributes"]["error.type"]
    assert activation["attributes"]["error.type"] == "CANCELLED"


def test_a_tool_call_that_waits_for_approval_is_one_span_under_the_activation(
    control: SubagentControl, parent: AgentHandle, otel: Otel
) -> None:
    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCall(id="c1", name="rm", arguments={})]), "removed"]
    )
    tool = ChildTool("rm", "Remove.", {"type": "object"}, lambda _a: "gone", approval="always")
    control.providers.register(InProcessProvider(model, tools=[tool]))
    started = start_child(control, parent, provider="inprocess", prompt="clean up")
    waiting = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    assert waiting.status is TaskStatus.INPUT_REQUIRED
    assert waiting.request is not None
    control.answer(parent, waiting.request.id, allow=True)
    eventually(
        lambda: control.tasks.get(started.task_id, requester=parent).status.is_terminal,
        "the answered Task settles",
    )

    # Answered within the run's grace period: one span from the call to its result,
    # the wait for the answer included, under the one activation.
    (activation,) = otel.spans("subagent.activation")
    (span,) = otel.spans("execute_tool rm")
    assert span.parent.span_id == activation.context.span_id
    assert span.status.status_code.name != "ERROR"
    assert "error.type" not in span.attributes


def test_a_kill_outside_any_span_links_its_lone_span_to_the_activation_it_killed(
    control: SubagentControl, parent: AgentHandle, otel: Otel
) -> None:
    model = ScriptedModel(["never answered"], gated=True)
    control.providers.register(InProcessProvider(model))
    started = start_child(control, parent, provider="inprocess", prompt="otters?")
    assert model.wait_for_calls(1, WAIT_S)

    control.tasks.kill(started.task_id, requester=parent)  # under no span of the caller's
    assert settle(control, started.task_id, parent).status is TaskStatus.KILLED

    (kill,) = otel.spans("subagent.kill")
    (activation,) = otel.spans("subagent.activation")
    assert kill.parent is None  # a trace of its own...
    assert kill.context.trace_id != activation.context.trace_id
    # ...linked to the activation it killed, which names the kill in an event.
    assert [link.context.span_id for link in kill.links] == [activation.context.span_id]
    assert kill.links[0].attributes["subagent.link"] == "activation"
    (event,) = [e for e in activation.events if e.name == "subagent.killed"]
    assert event.attributes["subagent.kill.span_id"] == format(kill.context.span_id, "016x")
