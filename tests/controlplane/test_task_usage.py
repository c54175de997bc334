"""Spend per activation, per child, per tree and per session (SPEC §11), and where it shows:
`TaskSnapshot.usage` while the turn runs and once it settled, from any runtime after a
restart; `control.usage(..., tree=True)` across a child that starts a child;
`control.session_usage`; the tree dump; the tool-call handlers' texts and notices.

Real stores (SQLite in ``tmp_path``, PostgreSQL when its URL is set); the model is a
`ScriptedModel` declaring each reply's usage, the tools real `ChildTool` s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    Price,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.contract import AgentHandle
from controlplane.models import ModelReply, ToolCall
from controlplane.tools import ToolHandlers
from tests.support import WAIT_S, eventually, raises

pytestmark = pytest.mark.timeout(60)

PRICES = {"m": Price(input=1_000_000, output=2_000_000)}  # $1 a token in, $2 out: round sums
FIRST = Usage(input_tokens=10, output_tokens=2)
SECOND = Usage(input_tokens=30, output_tokens=4)
ONE_TURN = Usage(input_tokens=40, output_tokens=6, model_calls=2, tool_calls=1, cost=52.0)


def tool_then_answer(tool: str = "work") -> ScriptedModel:
    """A model whose turn calls ``tool`` once, then answers: each reply's usage declared."""
    return ScriptedModel(
        [ModelReply(tool_calls=[ToolCall(id="c1", name=tool, arguments={})]), "done"],
        usage=[FIRST, SECOND],
    )


def gated_tool(gate: threading.Event, name: str = "work") -> ChildTool:
    def run(_arguments: dict[str, Any]) -> str:
        assert gate.wait(WAIT_S), "the test never opened the gate"
        return "worked"

    return ChildTool(name, "Work.", {"type": "object"}, run)


def start(control: SubagentControl, parent: AgentHandle, provider: str = "inprocess") -> Any:
    return control.start_continuable(
        ContinuableStartSpec(
            provider=provider, label="research X", prompt=[TextBlock(text="go")], parent=parent,
            agent_model="m",
        )
    )  # fmt: skip


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    opened = threading.Event()
    yield opened
    opened.set()  # never leave a tool waiting


def test_a_running_tasks_usage_is_what_its_turn_wrote_so_far_then_what_it_spent_from_anywhere(
    store_url: str, gate: threading.Event
) -> None:
    with SubagentControl.open(store_url, prices=PRICES) as control:
        control.providers.register(InProcessProvider(tool_then_answer(), tools=[gated_tool(gate)]))
        parent = control.agents.register("parent-1")
        started = start(control, parent)
        so_far = Usage(input_tokens=10, output_tokens=2, model_calls=1, cost=14.0)

        def first_call_counted() -> bool:
            return control.tasks.get(started.task_id, requester=parent).usage == so_far

        eventually(first_call_counted, "the running Task counts its first model call")
        running = control.tasks.get(started.task_id, requester=parent)
        assert running.status is TaskStatus.RUNNING
        assert [t.usage for t in control.tasks.list(parent)] == [so_far]
        (node,) = [n for n in control.dump_tree().supervisors if n.child_id == started.child_id]
        assert node.activation is not None
        assert node.activation.usage == so_far
        assert "tokens=12 calls=1 cost=$14.0000" in control.dump_tree().render()

        gate.set()
        settled = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert settled.status is TaskStatus.COMPLETED
        assert settled.usage == ONE_TURN

    with SubagentControl.open(store_url) as later:  # another runtime, after a restart
        parent = later.agents.register("parent-1")
        assert later.tasks.get(started.task_id, requester=parent).usage == ONE_TURN
        assert later.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent).usage == (
            ONE_TURN
        )
        assert [t.usage for t in later.tasks.list(parent)] == [ONE_TURN]
        (notice,) = later.tasks.drain_notices(parent)
        assert notice.summary == (
            f"subagent task {started.task_id} (research X) finished "
            "(spent 46 tokens, 2 model calls, 1 tool call, $52.0000): done"
        )


def test_a_trees_usage_counts_a_child_and_the_child_it_started_and_a_sessions_counts_all(
    store_url: str,
) -> None:
    """The child's tool starts a grandchild under the child's own session (the handle the
    child registered while it runs) and waits for it."""
    with SubagentControl.open(store_url, prices=PRICES) as control:
        started_child: dict[str, str] = {}
        known = threading.Event()

        def spawn(_arguments: dict[str, Any]) -> str:
            assert known.wait(WAIT_S)
            child = control.agents.get(started_child["id"])
            assert child is not None, "a running in-process child is a live agent"
            grand = start(control, child, provider="leaf")
            started_child["grandchild"] = grand.child_id
            done = control.tasks.wait(grand.task_id, timeout=WAIT_S, requester=child)
            assert done.status is TaskStatus.COMPLETED
            return "spawned"

        control.providers.register(
            InProcessProvider(
                tool_then_answer("spawn"),
                tools=[ChildTool("spawn", "Spawn.", {"type": "object"}, spawn)],
            )
        )
        leaf_spend = Usage(input_tokens=5, output_tokens=5)
        control.providers.register(
            InProcessProvider(ScriptedModel(["leaf"], usage=leaf_spend), name="leaf")
        )
        parent = control.agents.register("parent-1")
        started = start(control, parent)
        started_child["id"] = started.child_id
        known.set()
        settled = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert settled.status is TaskStatus.COMPLETED
        other = start(control, parent, provider="leaf")  # a sibling: the session's, not the tree's
        control.tasks.wait(other.task_id, timeout=WAIT_S, requester=parent)
        leaf = Usage(input_tokens=5, output_tokens=5, model_calls=1, cost=15.0)

        assert control.usage(parent, started.child_id) == ONE_TURN
        assert control.usage(parent, started.child_id, tree=True) == ONE_TURN + leaf
        assert control.session_usage(parent) == ONE_TURN + leaf + leaf
        assert control.session_usage("nobody") == Usage.zero()
        # The grandchild is the child's: its parent may read it whole, the session may not.
        grandchild = started_child["grandchild"]
        with raises(ErrorCode.CHILD_NOT_FOUND):
            control.usage(parent, grandchild, tree=True)
        assert control.usage(started.child_id, grandchild, tree=True) == leaf
        with raises(ErrorCode.INVALID_INPUT):
            control.usage(parent, started.child_id, tree="yes")  # type: ignore[arg-type]

    with SubagentControl.open(store_url) as later:  # read from the store after a restart
        got = asyncio.run(
            AsyncSubagentControl(later).usage("parent-1", started.child_id, tree=True)
        )
        assert got == ONE_TURN + leaf
        assert asyncio.run(AsyncSubagentControl(later).session_usage("parent-1")) == (
            ONE_TURN + leaf + leaf
        )


def test_the_tools_texts_say_what_each_child_and_task_spent(
    store_url: str, gate: threading.Event
) -> None:
    with SubagentControl.open(store_url, prices=PRICES) as control:
        control.providers.register(InProcessProvider(tool_then_answer(), tools=[gated_tool(gate)]))
        parent = control.agents.register("parent-1")
        tools = ToolHandlers(control, parent)
        started = start(control, parent)

        def spend() -> Usage:
            return control.tasks.get(started.task_id, requester=parent).usage

        eventually(lambda: spend().model_calls == 1, "the first model call is counted")

        running = tools.call("list_agents", {})
        assert running.text == (
            f"{started.child_id} [running] — research X — 12 tokens, 1 model call, $14.0000"
        )
        gate.set()
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)

        listed = tools.call("list_agents", {}).text
        assert listed == (
            f"{started.child_id} [ready] — research X — 46 tokens, 2 model calls, 1 tool call, "
            "$52.0000"
        )
        assert listed.startswith(f"{started.child_id} [ready] — research X")  # SPEC §7
        assert tools.call("task_list", {}).text == (
            f"{started.task_id} [completed] — research X (subagent {started.child_id}) — "
            "46 tokens, 2 model calls, 1 tool call, $52.0000"
        )
        # task_output keeps SPEC §7's format exactly: the output, then the status line.
        assert tools.call("task_output", {"task_id": started.task_id}).text == (
            "done\n[status: completed]"
        )


def test_another_runtime_reads_a_running_tasks_spend_so_far_from_its_open_turn(
    store_url: str, gate: threading.Event
) -> None:
    with (
        SubagentControl.open(store_url, prices=PRICES) as running_here,
        SubagentControl.open(store_url) as elsewhere,
    ):
        running_here.providers.register(
            InProcessProvider(tool_then_answer(), tools=[gated_tool(gate)])
        )
        parent = running_here.agents.register("parent-1")
        started = start(running_here, parent)
        so_far = Usage(input_tokens=10, output_tokens=2, model_calls=1, cost=14.0)

        def seen_elsewhere() -> bool:
            return elsewhere.tasks.get(started.task_id, requester="parent-1").usage == so_far

        eventually(seen_elsewhere, "another runtime reads the first call from the open turn")
        got = elsewhere.tasks.get(started.task_id, requester="parent-1")
        assert got.status is TaskStatus.RUNNING
        assert [t.usage for t in elsewhere.tasks.list("parent-1")] == [so_far]

        gate.set()
        running_here.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        settled = elsewhere.tasks.wait(started.task_id, timeout=WAIT_S, requester="parent-1")
        assert settled.usage == ONE_TURN
