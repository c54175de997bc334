"""Budgets (SPEC §11): a run stops before the model or tool call that would start past a
limit, the Task fails ``BUDGET_EXHAUSTED`` and its turn ends ``budget_exhausted``; a send to
that child is refused until `set_budget` gives it room; the soft notice comes once; a
grandchild's spend counts against its grandparent's budget; the tool-round cap ends a tool
loop; bad limits are coded errors that change nothing.

The models are `ScriptedModel` s that report usage per reply, so each test knows what every
call spends; the stores are SQLite in ``tmp_path`` and PostgreSQL when its URL is set.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    Budget,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ModelSelector,
    Price,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.models import ModelReply, ToolCall
from controlplane.tools import ToolHandlers

WAIT_S = 10.0
LOOK = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])
SPEND_60 = Usage(input_tokens=50, output_tokens=10)

Open = Callable[..., SubagentControl]


class Looks:
    """A ``look`` tool that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.tool = ChildTool("look", "Look around.", {"type": "object"}, self._run)

    def _run(self, _arguments: dict[str, Any]) -> str:
        self.calls += 1
        return f"seen {self.calls}"


@pytest.fixture
def opened(store_url: str) -> Iterator[Open]:
    """Open control planes on the test's store (closed after the test)."""
    made: list[SubagentControl] = []

    def open_(
        model: ScriptedModel, tools: list[ChildTool] | None = None, **options: Any
    ) -> SubagentControl:
        control = SubagentControl.open(store_url, **options)
        control.providers.register(InProcessProvider(model, tools=tools or []))
        made.append(control)
        return control

    yield open_
    for control in made:
        control.close(timeout_s=10.0)


def start(
    control: SubagentControl, parent: AgentHandle, budget: Any = None, prompt: str = "go"
) -> tuple[str, TaskSnapshot]:
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="spender", prompt=[TextBlock(text=prompt)],
            parent=parent, budget=budget,
        )
    )  # fmt: skip
    snapshot = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    return started.child_id, snapshot


def events(control: SubagentControl, child_id: str) -> list[SessionEvent]:
    assert control.store is not None
    return control.store.load(child_id).events


def last_turn_end(control: SubagentControl, child_id: str) -> dict[str, Any]:
    ends = [e.data for e in events(control, child_id) if e.kind == EventKind.TURN_END]
    assert ends, "no turn ended"
    end = ends[-1]
    assert isinstance(end, dict)
    return end


def count(control: SubagentControl, child_id: str, kind: str) -> int:
    return sum(1 for e in events(control, child_id) if e.kind == kind)


def assert_exhausted(snapshot: TaskSnapshot, detail: str) -> None:
    assert snapshot.status is TaskStatus.FAILED, snapshot
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.BUDGET_EXHAUSTED
    assert detail in (snapshot.outcome.detail or ""), snapshot.outcome.detail


# -- the hard stop -----------------------------------------------------------------------------


def test_a_run_stops_before_the_model_call_that_would_start_past_its_token_budget(
    opened: Open,
) -> None:
    looks = Looks()
    model = ScriptedModel([LOOK, LOOK, LOOK, "done"], usage=SPEND_60)
    control = opened(model, [looks.tool])
    parent = control.agents.register("parent-1")

    child_id, snapshot = start(control, parent, Budget(tokens=100))

    # Call 1 starts at 0 and call 2 at 60 (within the limit: it may finish past it, at
    # 120); call 3 would start past it and never does. The tools of call 2 spend no tokens.
    assert model.call_count == 2
    assert looks.calls == 2
    assert_exhausted(snapshot, "token budget of 100 spent: 120")
    assert last_turn_end(control, child_id) == {
        "task_id": snapshot.id,
        "status": "budget_exhausted",
    }
    assert control.usage(parent, child_id).total_tokens == 120


def test_a_tool_call_past_the_tool_call_budget_never_runs_nor_is_written(opened: Open) -> None:
    looks = Looks()
    three = ModelReply(
        tool_calls=[ToolCall(id=f"c{n}", name="look", arguments={}) for n in range(3)]
    )
    model = ScriptedModel([three, "done"])
    control = opened(model, [looks.tool])
    parent = control.agents.register("parent-1")

    child_id, snapshot = start(control, parent, {"tool_calls": 2})

    assert looks.calls == 2
    assert model.call_count == 1
    assert count(control, child_id, "tool/call") == 2
    assert count(control, child_id, "tool/result") == 2
    assert_exhausted(snapshot, "tool call budget of 2 spent: 2")
    assert last_turn_end(control, child_id)["status"] == "budget_exhausted"


# Each call of the priced model costs 0.6: a token in and a token out at 300,000 a million.
PRICES = {"m1": Price(input=300_000, output=300_000)}
PRICED_PARENT = ModelSelector(provider="inprocess", model="m1")


def test_a_cost_budget_stops_the_run_once_the_priced_calls_reach_it(opened: Open) -> None:
    model = ScriptedModel([LOOK, LOOK, LOOK, "done"], usage=Usage(input_tokens=1, output_tokens=1))
    control = opened(model, [Looks().tool], prices=PRICES)
    parent = control.agents.register("parent-1", model=PRICED_PARENT)

    _child_id, snapshot = start(control, parent, Budget(cost=1.0))

    assert model.call_count == 2
    assert_exhausted(snapshot, "cost budget of 1 spent: 1.2")


def test_a_cost_budget_for_a_model_with_no_price_is_refused_and_stores_nothing(
    opened: Open,
) -> None:
    control = opened(ScriptedModel(["done"]), prices=PRICES)
    unpriced = control.agents.register("parent-1", model=ModelSelector(provider="x", model="m2"))
    priced = control.agents.register("parent-2", model=PRICED_PARENT)
    assert control.store is not None

    with pytest.raises(SubagentControlError) as caught:
        start(control, unpriced, Budget(cost=1.0))
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "price" in str(caught.value)
    assert control.tasks.list(unpriced) == []
    assert control.store.list_children("parent-1") == []

    # set_budget refuses a cost limit for an unpriced child the same way, and keeps its budget.
    child_id, done = start(control, unpriced, Budget(tokens=1_000))
    assert done.status is TaskStatus.COMPLETED
    with pytest.raises(SubagentControlError) as caught:
        control.set_budget(unpriced, child_id, Budget(cost=1.0))
    assert caught.value.code is ErrorCode.INVALID_INPUT
    control.set_budget(unpriced, child_id, Budget(model_calls=1))  # its one call reached it
    with pytest.raises(SubagentControlError) as refused:
        control.send_message(unpriced, child_id, [TextBlock(text="again")])
    assert refused.value.code is ErrorCode.BUDGET_EXHAUSTED

    # A priced child takes a cost limit at start and later.
    priced_child, done = start(control, priced, Budget(cost=100.0))
    assert done.status is TaskStatus.COMPLETED
    control.set_budget(priced, priced_child, Budget(cost=200.0))


def test_a_seconds_budget_counts_the_running_turn_and_then_every_ended_one(opened: Open) -> None:
    # Each call takes 0.6 s (the model's latency, cut short by a kill): the first starts at
    # once, well within 0.3 s; the second would start past it.
    model = ScriptedModel([LOOK, LOOK, "done"], delay_s=0.6)
    control = opened(model, [Looks().tool])
    parent = control.agents.register("parent-1")

    child_id, snapshot = start(control, parent, Budget(seconds=0.3))

    assert model.call_count == 1
    assert_exhausted(snapshot, "wall-clock seconds budget of 0.3 spent: ")
    # The ended turn's time is in the store: the next turn could not even begin.
    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="more")])
    assert caught.value.code is ErrorCode.BUDGET_EXHAUSTED
    assert "wall-clock seconds budget of 0.3" in caught.value.message


def test_a_run_within_its_budget_completes_and_its_turn_ends_as_usual(opened: Open) -> None:
    model = ScriptedModel([LOOK, "done"], usage=SPEND_60)
    control = opened(model, [Looks().tool])
    parent = control.agents.register("parent-1")

    child_id, snapshot = start(control, parent, Budget(tokens=1000, model_calls=2))

    assert snapshot.status is TaskStatus.COMPLETED
    assert last_turn_end(control, child_id) == {"task_id": snapshot.id, "status": "completed"}


def test_a_tool_loop_is_stopped_by_the_round_cap(opened: Open) -> None:
    looks = Looks()
    model = ScriptedModel([LOOK])  # the last reply repeats: tools for ever
    control = opened(model, [looks.tool], max_tool_rounds=3)
    parent = control.agents.register("parent-1")

    child_id, snapshot = start(control, parent)

    assert looks.calls == 3
    assert model.call_count == 4  # its fourth reply asked for a fourth round
    assert_exhausted(snapshot, "tool round cap of 3 per turn reached")
    assert last_turn_end(control, child_id)["status"] == "budget_exhausted"


def test_the_default_round_cap_is_fifty(opened: Open) -> None:
    looks = Looks()
    control = opened(ScriptedModel([LOOK]), [looks.tool])
    parent = control.agents.register("parent-1")

    _child_id, snapshot = start(control, parent)

    assert looks.calls == 50
    assert_exhausted(snapshot, "tool round cap of 50 per turn reached")


# -- refusal, and raise-then-resume --------------------------------------------------------------


def test_a_send_to_an_exhausted_child_is_refused_from_every_route_until_its_budget_is_raised(
    opened: Open,
) -> None:
    model = ScriptedModel([LOOK, LOOK, "done", "again"], usage=SPEND_60)
    control = opened(model, [Looks().tool])
    parent = control.agents.register("parent-1")
    child_id, snapshot = start(control, parent, Budget(tokens=100))
    assert_exhausted(snapshot, "token budget of 100 spent: 120")
    stored, tasks, calls = len(events(control, child_id)), len(control.tasks.list(parent)), 2
    control.tasks.drain_notices(parent)

    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="more")])
    assert caught.value.code is ErrorCode.BUDGET_EXHAUSTED
    assert "token budget of 100 spent: 120" in caught.value.message
    with pytest.raises(SubagentControlError) as via_aio:
        asyncio.run(
            AsyncSubagentControl(control).send_message(parent, child_id, [TextBlock(text="x")])
        )
    assert via_aio.value.code is ErrorCode.BUDGET_EXHAUSTED
    tools = ToolHandlers(control, parent)
    refused = tools.call("send_message", {"subagent_id": child_id, "message": "more"})
    assert refused.is_error
    assert refused.text.startswith("error [BUDGET_EXHAUSTED]: ")
    # Nothing delivered, no Task, no notice, no model call.
    assert len(events(control, child_id)) == stored
    assert len(control.tasks.list(parent)) == tasks
    assert control.tasks.drain_notices(parent) == []
    assert model.call_count == calls

    # A raise that still leaves no room changes nothing; one that does lets it go on.
    control.set_budget(parent, child_id, Budget(tokens=120))
    with pytest.raises(SubagentControlError) as still:
        control.send_message(parent, child_id, [TextBlock(text="more")])
    assert still.value.code is ErrorCode.BUDGET_EXHAUSTED
    raised = tools.call("set_budget", {"subagent_id": child_id, "tokens": 1000})
    assert raised.text == f"budget of subagent {child_id} set: tokens 1000", raised
    sent = control.send_message(parent, child_id, [TextBlock(text="more")])

    assert sent.route == "started"
    resumed = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert resumed.status is TaskStatus.COMPLETED, resumed
    assert control.usage(parent, child_id).total_tokens == 180  # the spend so far counted


def test_removing_a_budget_lets_the_child_run_without_limits(opened: Open) -> None:
    model = ScriptedModel([LOOK, LOOK, "done"], usage=SPEND_60)
    control = opened(model, [Looks().tool])
    parent = control.agents.register("parent-1")
    child_id, snapshot = start(control, parent, Budget(model_calls=1))
    assert_exhausted(snapshot, "model call budget of 1 spent: 1")

    asyncio.run(AsyncSubagentControl(control).set_budget(parent, child_id, None))
    sent = control.send_message(parent, child_id, [TextBlock(text="go on")])

    assert control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )


def test_only_the_childs_parent_may_set_its_budget(opened: Open) -> None:
    control = opened(ScriptedModel(["done"]))
    parent = control.agents.register("parent-1")
    stranger = control.agents.register("stranger")
    child_id, _ = start(control, parent)

    for requester, asked in [
        (stranger, child_id),
        ("stranger", child_id),
        (parent, "nope"),
        (parent, ""),
    ]:
        with pytest.raises(SubagentControlError) as caught:
            control.set_budget(requester, asked, Budget(tokens=1))
        assert caught.value.code is ErrorCode.CHILD_NOT_FOUND
    refused = ToolHandlers(control, stranger).call(
        "set_budget", {"subagent_id": child_id, "tokens": 1}
    )
    assert refused.text.startswith("error [CHILD_NOT_FOUND]: ")
    # Still no budget: the parent's next turn runs.
    sent = control.send_message(parent, child_id, [TextBlock(text="again")])
    assert control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )


# -- the soft notice ---------------------------------------------------------------------------


def budget_notices(control: SubagentControl, parent: AgentHandle | str) -> list[str]:
    return [
        n.summary
        for n in control.tasks.drain_notices(parent)
        if n.summary.startswith("budget notice")
    ]


def test_the_soft_notice_comes_once_across_a_restart(opened: Open) -> None:
    spend_45 = Usage(input_tokens=40, output_tokens=5)
    first = opened(ScriptedModel(["one", "two"], usage=spend_45))
    parent = first.agents.register("parent-1")
    child_id, snapshot = start(first, parent, Budget(tokens=100))
    assert snapshot.status is TaskStatus.COMPLETED
    assert budget_notices(first, parent) == []  # 45 of 100: under 80%
    sent = first.send_message(parent, child_id, [TextBlock(text="again")])
    second_turn = first.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert second_turn.status is TaskStatus.COMPLETED  # 90 of 100: past 80%, not past 100%
    first.close()

    second = opened(ScriptedModel(["three"], usage=Usage(input_tokens=1)))
    parent = second.agents.register("parent-1")
    notices = [n for n in second.tasks.drain_notices(parent) if n.summary.startswith("budget")]
    assert len(notices) == 1
    (notice,) = notices
    assert notice.task_id == second_turn.id
    assert notice.child_id == child_id
    assert notice.status is TaskStatus.RUNNING
    assert notice.summary == (
        f"budget notice: subagent {child_id} has spent 90% of its token budget (90 of 100)"
    )
    sent = second.send_message(parent, child_id, [TextBlock(text="once more")])
    assert second.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )
    assert budget_notices(second, parent) == []  # still past 80%: never told twice


def test_a_session_budgets_soft_notice_goes_to_the_session_naming_the_task_that_crossed(
    opened: Open,
) -> None:
    control = opened(
        ScriptedModel(["one"], usage=Usage(input_tokens=45)), session_budget={"tokens": 100}
    )
    parent = control.agents.register("parent-1")
    _first, _ = start(control, parent)
    assert budget_notices(control, parent) == []
    second, crossing = start(control, parent)

    notices = [n for n in control.tasks.drain_notices(parent) if n.summary.startswith("budget")]

    assert [(n.task_id, n.child_id, n.summary) for n in notices] == [
        (
            crossing.id,
            second,
            "budget notice: session parent-1 (its subagents together) has spent 90% of its "
            "token budget (90 of 100)",
        )
    ]


def test_no_soft_notice_when_it_is_turned_off(opened: Open) -> None:
    control = opened(ScriptedModel(["one"], usage=SPEND_60), budget_notice_at=None)
    parent = control.agents.register("parent-1")
    start(control, parent, Budget(tokens=70))

    assert budget_notices(control, parent) == []


# -- trees and sessions -------------------------------------------------------------------------


def test_a_grandchilds_spend_stops_it_at_its_grandparents_tree_budget(opened: Open) -> None:
    model = ScriptedModel(["planned", LOOK, LOOK, "done"], usage=SPEND_60)
    control = opened(model, [Looks().tool], tree_budget=Budget(tokens=100))
    parent = control.agents.register("parent-1")
    top_id, snapshot = start(control, parent, prompt="plan")  # takes the tree budget
    assert snapshot.status is TaskStatus.COMPLETED  # 60 of its 100

    # The top child starts one of its own, as its run would: under its own session id.
    as_child = control.agents.register(top_id, depth=1)
    grand = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="grandchild", prompt=[TextBlock(text="dig")],
            parent=as_child,
        )
    )  # fmt: skip
    grand_task = control.tasks.wait(grand.task_id, timeout=WAIT_S, requester=as_child)
    as_child.dispose()

    # Its first call starts at 60 (within its grandparent's 100) and ends at 120; its
    # second would start past the limit: the grandchild has no budget of its own.
    assert model.call_count == 2
    assert_exhausted(
        grand_task,
        f"token budget of 100 spent: 120 (the budget of subagent {top_id}, which it runs under)",
    )
    assert control.usage(parent, top_id).total_tokens == 60  # its own events only
    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, top_id, [TextBlock(text="go on")])
    assert caught.value.code is ErrorCode.BUDGET_EXHAUSTED


def test_a_session_budget_holds_every_child_of_the_session_together(opened: Open) -> None:
    model = ScriptedModel(["one"], usage=SPEND_60)
    control = opened(model, session_budget=Budget(tokens=100))
    parent = control.agents.register("parent-1")
    other = control.agents.register("parent-2")

    _a, first = start(control, parent)
    _b, second = start(control, parent)
    _c, third = start(control, parent)
    _d, elsewhere = start(control, other)

    assert first.status is second.status is TaskStatus.COMPLETED  # 0, then 60: within
    assert_exhausted(third, "(the budget of session parent-1, shared by its subagents)")
    assert elsewhere.status is TaskStatus.COMPLETED  # another session: its own budget


# -- bad input ----------------------------------------------------------------------------------


BAD_LIMITS = [
    {"tokens": -1},
    {"tokens": 0},
    {"cost": float("nan")},
    {"cost": float("inf")},
    {"seconds": 0.0},
    {"model_calls": True},
    {"tool_calls": "3"},
    {"tokens": 1.5},
    {"cost": "cheap"},
    {"minutes": 3},
]


@pytest.mark.parametrize("limits", BAD_LIMITS, ids=repr)
def test_a_bad_limit_is_an_invalid_input_error_wherever_it_is_given(
    opened: Open, limits: dict[str, Any]
) -> None:
    control = opened(ScriptedModel(["done"], usage=SPEND_60))
    parent = control.agents.register("parent-1")
    child_id, _ = start(control, parent, Budget(tokens=100))
    assert control.store is not None
    children = len(control.store.list_children())

    for make in (
        lambda: Budget(**limits),
        lambda: Budget.model_validate(limits),
        lambda: start(control, parent, limits),
        lambda: control.set_budget(parent, child_id, limits),
    ):
        with pytest.raises(SubagentControlError) as caught:
            make()
        assert caught.value.code is ErrorCode.INVALID_INPUT, caught.value

    # Nothing stored: no child, no Task, and the old budget holds (100, 60 spent: a second
    # turn runs, a third does not).
    assert len(control.store.list_children()) == children
    assert len(control.tasks.list(parent)) == 1
    tools = ToolHandlers(control, parent)
    bad_tool = tools.call("set_budget", {"subagent_id": child_id, **limits})
    assert bad_tool.is_error, bad_tool
    assert bad_tool.code == "INVALID_INPUT", bad_tool
    sent = control.send_message(parent, child_id, [TextBlock(text="again")])
    got = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert got.status is TaskStatus.COMPLETED  # started at 60 of 100, ended at 120
    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="and again")])
    assert caught.value.code is ErrorCode.BUDGET_EXHAUSTED


@pytest.mark.parametrize(
    "options",
    [
        {"session_budget": {"cost": -1}},
        {"session_budget": "lots"},
        {"tree_budget": {"tokens": 0}},
        {"tree_budget": 100},
        {"budget_notice_at": 0},
        {"budget_notice_at": 1.5},
        {"budget_notice_at": True},
        {"budget_notice_at": float("nan")},
        {"budget_notice_at": "0.8"},
        {"max_tool_rounds": 0},
        {"max_tool_rounds": 2.5},
        {"max_tool_rounds": True},
    ],
    ids=repr,
)
def test_a_bad_budget_option_is_refused_at_open_and_leaves_no_store_behind(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    path = tmp_path / "state.db"

    with pytest.raises(SubagentControlError) as caught:
        SubagentControl.open(f"sqlite:///{path}", **options)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert not os.path.exists(path)
    with pytest.raises(SubagentControlError) as direct:
        SubagentControl(None, **options)
    assert direct.value.code is ErrorCode.INVALID_INPUT
