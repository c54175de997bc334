"""Approvals (SPEC §11): a child's tool call that needs approval is written as a request
before anything runs, its Task reads ``input_required`` with the request, the parent gets
one notice; `answer` is taken once, by the child's parent or a human; allowed, the tool
runs once and the Task that asked goes on and settles; denied, the model reads why. A run
waiting past its grace period parks (no thread) and the answer continues it — across a
close and a reopen too. Messages sent meanwhile land in the same turn.

Both backends: SQLite in ``tmp_path``, PostgreSQL when its URL is set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.models import ModelReply, ToolCall
from controlplane.providers._agent_loop import THREAD_PREFIX
from controlplane.tools import ToolHandlers

WAIT_S = 10.0
DEPLOY = ModelReply(
    text="shipping it", tool_calls=[ToolCall(id="c1", name="deploy", arguments={"env": "prod"})]
)

pytestmark = pytest.mark.timeout(60)

GRACES = pytest.mark.parametrize("grace", [30.0, 0.05], ids=["waiting", "parked"])
"""A run that waits for its answer holding its thread, and one that parks at once."""


class Deploys:
    """A ``deploy`` tool that needs approval and counts its runs."""

    def __init__(self, approval: Any = "always", deadline_s: float | None = None) -> None:
        self.runs: list[dict[str, Any]] = []
        self.tool = ChildTool(
            "deploy",
            "Deploy.",
            {"type": "object", "properties": {"env": {"type": "string"}}},
            self._run,
            approval=approval,
            approval_deadline_s=deadline_s,
        )

    def _run(self, arguments: dict[str, Any]) -> str:
        self.runs.append(arguments)
        return f"deployed {arguments['env']}"


Open = Callable[..., SubagentControl]


@pytest.fixture
def opened(store_url: str) -> Iterator[Open]:
    made: list[SubagentControl] = []

    def open_(model: ScriptedModel, tools: list[ChildTool], **options: Any) -> SubagentControl:
        control = SubagentControl.open(store_url, **options)
        control.providers.register(InProcessProvider(model, tools=tools))
        made.append(control)
        return control

    yield open_
    for control in made:
        control.close(timeout_s=10.0)


def start(control: SubagentControl, parent: AgentHandle, label: str = "ship") -> tuple[str, str]:
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label=label, prompt=[TextBlock(text="go")], parent=parent
        )
    )
    return started.child_id, started.task_id


def asked(control: SubagentControl, parent: AgentHandle, task_id: str) -> TaskSnapshot:
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert snapshot.status is TaskStatus.INPUT_REQUIRED, snapshot
    assert snapshot.request is not None
    return snapshot


def kinds(control: SubagentControl, child_id: str) -> list[str]:
    assert control.store is not None
    return [e.kind for e in control.store.load(child_id).events]


def loop_threads(child_id: str) -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and child_id in t.name
    ]


def settled(control: SubagentControl, parent: AgentHandle, task_id: str) -> TaskSnapshot:
    """Its outcome, once nothing more is asked (a wait returns on ``input_required``)."""
    wait_until(lambda: control.tasks.get(task_id, requester=parent).status.is_terminal, "settled")
    return control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_call_that_needs_approval_is_asked_before_it_runs_and_runs_once_when_allowed(
    opened: Open,
) -> None:
    deploys = Deploys()
    control = opened(ScriptedModel([DEPLOY, "done"]), [deploys.tool], approval_grace_s=30.0)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)

    waiting = asked(control, parent, task_id)
    request = waiting.request
    assert request is not None
    assert (request.tool, request.arguments, request.reason) == ("deploy", {"env": "prod"},
                                                                  "shipping it")  # fmt: skip
    assert deploys.runs == []  # nothing ran before the answer
    assert kinds(control, child_id)[-2:] == ["tool/call", EventKind.APPROVAL_REQUEST]
    assert [t.status for t in control.tasks.list(parent)] == [TaskStatus.INPUT_REQUIRED]
    assert control.tasks.list(parent)[0].request == request

    control.answer(parent, request.id, allow=True, note="go ahead")
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED
    assert done.outcome is not None
    assert done.outcome.output == "done"
    assert done.request is None
    assert deploys.runs == [{"env": "prod"}]
    assert kinds(control, child_id)[-5:] == [
        EventKind.APPROVAL_REQUEST, EventKind.APPROVAL_ANSWER, "tool/result",
        EventKind.ASSISTANT_MESSAGE, EventKind.TURN_END,
    ]  # fmt: skip


def test_the_parent_gets_one_notice_naming_the_child_the_tool_and_how_to_answer(
    opened: Open,
) -> None:
    control = opened(ScriptedModel([DEPLOY, "done"]), [Deploys().tool])
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None

    (notice,) = control.tasks.drain_notices(parent)
    assert notice.status is TaskStatus.INPUT_REQUIRED
    assert child_id in notice.summary
    assert "deploy" in notice.summary
    assert request.id in notice.summary
    assert "answer(" in notice.summary
    assert control.tasks.drain_notices(parent) == []  # taken once


def test_a_denied_call_never_runs_and_the_model_reads_the_denial_with_its_note(
    opened: Open,
) -> None:
    deploys = Deploys()
    model = ScriptedModel([DEPLOY, "understood"])
    control = opened(model, [deploys.tool], approval_grace_s=30.0)
    parent = control.agents.register("p1")
    _child, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None

    control.answer(parent, request.id, allow=False, note="freeze week")
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED
    assert deploys.runs == []
    tool_message = model.calls[-1].messages[-1]
    assert tool_message.role == "tool"
    assert tool_message.tool_call_id == "c1"
    assert "denied" in tool_message.text
    assert "freeze week" in tool_message.text


def test_a_run_past_its_grace_parks_holding_no_thread_and_the_answer_continues_the_same_task(
    opened: Open,
) -> None:
    deploys = Deploys()
    model = ScriptedModel([DEPLOY, "done"])
    control = opened(model, [deploys.tool], approval_grace_s=0.05)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    wait_until(lambda: not loop_threads(child_id), "the parked run's thread ended")
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.INPUT_REQUIRED

    control.answer(parent, request.id, allow=True)
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert (done.id, done.status) == (task_id, TaskStatus.COMPLETED)
    assert deploys.runs == [{"env": "prod"}]
    # One turn: the continued activation wrote no second frame.
    assert kinds(control, child_id).count(EventKind.TURN_START) == 1
    # The continued model saw the call and its result, as the live one would have.
    seen = model.calls[-1].messages
    assert [m.role for m in seen[-3:]] == ["user", "assistant", "tool"]
    assert seen[-1].text == "deployed prod"


def test_an_answer_is_taken_once_and_only_from_the_childs_parent_or_a_human(
    opened: Open,
) -> None:
    control = opened(ScriptedModel([DEPLOY, "done"]), [Deploys().tool], approval_grace_s=0.05)
    parent = control.agents.register("p1")
    stranger = control.agents.register("p2")
    _child, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None

    with pytest.raises(SubagentControlError) as foreign:
        control.answer(stranger, request.id, allow=True)
    assert foreign.value.code is ErrorCode.REQUEST_NOT_FOUND
    with pytest.raises(SubagentControlError) as unknown:
        control.answer(parent, "no-such-request", allow=True)
    assert unknown.value.code is ErrorCode.REQUEST_NOT_FOUND
    with pytest.raises(SubagentControlError) as bad:
        control.answer(parent, request.id, allow="yes")  # type: ignore[arg-type]
    assert bad.value.code is ErrorCode.INVALID_INPUT
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.INPUT_REQUIRED

    # A person may answer from any session.
    control.answer(stranger, request.id, allow=True, source=MessageSource(kind="human"))
    with pytest.raises(SubagentControlError) as again:
        control.answer(parent, request.id, allow=False)
    assert again.value.code is ErrorCode.REQUEST_CLOSED
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED


@GRACES
def test_an_unanswered_request_is_denied_at_its_deadline_waiting_or_parked(
    opened: Open, grace: float
) -> None:
    deploys = Deploys(deadline_s=0.3)
    model = ScriptedModel([DEPLOY, "gave up"])
    control = opened(model, [deploys.tool], approval_grace_s=grace)
    parent = control.agents.register("p1")
    _child, task_id = start(control, parent)
    asked(control, parent, task_id)
    done = settled(control, parent, task_id)
    assert done.status is TaskStatus.COMPLETED, grace
    assert deploys.runs == []
    assert "no answer came within 0.3s" in model.calls[-1].messages[-1].text


def test_a_callable_policy_asks_only_for_the_calls_it_picks(opened: Open) -> None:
    deploys = Deploys(approval=lambda arguments: arguments.get("env") == "prod")
    stage = ModelReply(tool_calls=[ToolCall(id="s1", name="deploy", arguments={"env": "stage"})])
    control = opened(ScriptedModel([stage, "staged"]), [deploys.tool])
    parent = control.agents.register("p1")
    _child, task_id = start(control, parent)
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED
    assert deploys.runs == [{"env": "stage"}]


def test_the_calls_after_the_asking_one_run_once_answered_and_history_matches_the_live_one(
    opened: Open,
) -> None:
    looks: list[str] = []
    look = ChildTool("look", "Look.", {"type": "object"}, lambda _a: looks.append("x") or "seen")
    deploys = Deploys()
    three = ModelReply(
        tool_calls=[
            ToolCall(id="a", name="look", arguments={}),
            ToolCall(id="b", name="deploy", arguments={"env": "prod"}),
            ToolCall(id="c", name="look", arguments={}),
        ]
    )
    model = ScriptedModel([three, "done"])
    control = opened(model, [look, deploys.tool], approval_grace_s=0.05)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    assert looks == ["x"]
    control.answer(parent, request.id, allow=True)
    assert control.tasks.wait(task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )
    assert looks == ["x", "x"]
    assert len(deploys.runs) == 1
    live = model.calls[-1].messages
    assert [m.role for m in live] == ["user", "assistant", "tool", "tool", "tool"]
    assert [c.id for c in live[1].tool_calls] == ["a", "b", "c"]
    # A later resume rebuilds the same conversation from the transcript.
    control.send_message(parent, child_id, [TextBlock(text="again")],
                         MessageSource(kind="coordinator"))  # fmt: skip
    wait_until(lambda: len(model.calls) == 3, "the resume called the model")
    rebuilt = model.calls[-1].messages
    assert [m.model_dump() for m in rebuilt[: len(live) + 1]] == [
        m.model_dump() for m in [*live, rebuilt[len(live)]]
    ]


@GRACES
def test_a_message_to_a_waiting_child_steers_the_same_turn_live_or_parked(
    opened: Open, grace: float
) -> None:
    model = ScriptedModel([DEPLOY, "done"])
    control = opened(model, [Deploys().tool], approval_grace_s=grace)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    if grace < 1:
        wait_until(lambda: not loop_threads(child_id), "parked")
    sent = control.send_message(parent, child_id, [TextBlock(text="use the blue env")],
                                MessageSource(kind="coordinator"))  # fmt: skip
    assert (sent.route, sent.task_id) == ("steered", task_id)
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.INPUT_REQUIRED
    control.answer(parent, request.id, allow=True)
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED
    texts = [m.text for m in model.calls[-1].messages]
    assert texts[-1] == "use the blue env", texts  # read before the model went on
    assert kinds(control, child_id).count(EventKind.STEERING_MESSAGE) == 1


@GRACES
def test_killing_a_waiting_task_settles_it_killed_and_closes_its_request(
    opened: Open, grace: float
) -> None:
    deploys = Deploys()
    control = opened(ScriptedModel([DEPLOY, "done"]), [deploys.tool], approval_grace_s=grace)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    if grace < 1:
        wait_until(lambda: not loop_threads(child_id), "parked")
    control.tasks.kill(task_id, requester=parent)
    wait_until(
        lambda: control.tasks.get(task_id, requester=parent).status is TaskStatus.KILLED,
        f"killed after {grace}s of grace",
    )
    with pytest.raises(SubagentControlError) as closed:
        control.answer(parent, request.id, allow=True)
    assert closed.value.code is ErrorCode.REQUEST_CLOSED
    assert kinds(control, child_id)[-1] == EventKind.TURN_END
    assert deploys.runs == []
    assert control.tasks.drain_notices(parent)[-1].status is TaskStatus.KILLED


def test_a_waiting_task_outlives_a_close_and_the_answer_after_a_reopen_continues_it(
    opened: Open,
) -> None:
    deploys = Deploys()
    first = opened(ScriptedModel([DEPLOY]), [deploys.tool], approval_grace_s=30.0)
    parent = first.agents.register("p1")
    child_id, task_id = start(first, parent)
    request = asked(first, parent, task_id).request
    assert request is not None
    first.close()

    second = opened(ScriptedModel(["done after restart"]), [deploys.tool])
    again = second.agents.register("p1")
    assert second.tasks.get(task_id, requester=again).status is TaskStatus.INPUT_REQUIRED
    second.answer(again, request.id, allow=True)
    done = second.tasks.wait(task_id, timeout=WAIT_S, requester=again)
    assert (done.status, deploys.runs) == (TaskStatus.COMPLETED, [{"env": "prod"}])
    assert done.outcome is not None
    assert done.outcome.output == "done after restart"
    assert kinds(second, child_id).count(EventKind.TURN_START) == 1


def test_the_answer_tool_answers_for_the_parent_model(opened: Open) -> None:
    deploys = Deploys()
    control = opened(ScriptedModel([DEPLOY, "done"]), [deploys.tool], approval_grace_s=0.05)
    parent = control.agents.register("p1")
    tools = ToolHandlers(control, parent, provider="inprocess")
    _child, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None

    shown = tools.call("task_output", {"task_id": task_id})
    assert "[status: input_required]" in shown.text
    assert request.id in shown.text
    assert request.id in tools.call("task_list", {}).text
    bad = tools.call("answer", {"request_id": request.id, "allow": "yes"})
    assert bad.is_error
    assert bad.code == ErrorCode.INVALID_INPUT
    ok = tools.call("answer", {"request_id": request.id, "allow": True, "note": "fine"})
    assert not ok.is_error
    assert "allowed" in ok.text
    twice = tools.call("answer", {"request_id": request.id, "allow": True})
    assert twice.is_error
    assert twice.code == ErrorCode.REQUEST_CLOSED
    assert control.tasks.wait(task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )


def test_aio_wait_returns_on_input_required_and_answer_is_awaitable(opened: Open) -> None:
    import asyncio

    control = opened(ScriptedModel([DEPLOY, "done"]), [Deploys().tool])
    parent = control.agents.register("p1")
    _child, task_id = start(control, parent)

    async def run() -> TaskStatus:
        aio = AsyncSubagentControl(control)
        waiting = await aio.wait(task_id, timeout=WAIT_S, requester=parent)
        assert waiting.status is TaskStatus.INPUT_REQUIRED
        assert waiting.request is not None
        await aio.answer(parent, waiting.request.id, allow=True)
        return (await aio.wait(task_id, timeout=WAIT_S, requester=parent)).status

    assert asyncio.run(run()) is TaskStatus.COMPLETED


def test_hostile_arguments_are_clipped_in_the_notice_and_whole_in_the_transcript(
    opened: Open,
) -> None:
    huge = "x" * 200_000 + "\ud800"  # and a lone surrogate, which UTF-8 cannot hold
    call = ModelReply(tool_calls=[ToolCall(id="h", name="deploy", arguments={"env": huge})])
    control = opened(ScriptedModel([call, "done"]), [Deploys().tool])
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    (notice,) = control.tasks.drain_notices(parent)
    assert len(notice.summary) < 1_000
    notice.summary.encode("utf-8")  # storable, printable
    assert control.store is not None
    stored = [e for e in control.store.load(child_id).events if e.kind == "approval/request"]
    assert len(stored[0].data["arguments"]["env"]) == len(huge)


def test_bad_approval_options_are_refused_with_a_code() -> None:
    for bad in ({"approval": "sometimes"}, {"approval_deadline_s": 0}, {"approval": 3}):
        with pytest.raises(SubagentControlError) as refused:
            ChildTool("t", "T.", {"type": "object"}, lambda _a: "", **bad)
        assert refused.value.code is ErrorCode.INVALID_INPUT
    with pytest.raises(SubagentControlError) as grace:
        SubagentControl(approval_grace_s=-1)
    assert grace.value.code is ErrorCode.INVALID_INPUT


def test_a_waiting_task_reads_input_required_in_the_tree_top_and_the_cli(
    opened: Open, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from controlplane.cli import main
    from controlplane.cli._top import render

    control = opened(ScriptedModel([DEPLOY, "done"]), [Deploys().tool], approval_grace_s=30.0)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    asked(control, parent, task_id)

    tree = control.dump_tree()
    (node,) = [n for n in tree.supervisors if n.child_id == child_id]
    assert node.task_status == "input_required"
    assert node.activation is not None
    assert node.activation.task_status == "input_required"
    assert any("input_required" in line for line in render(tree, source="test"))

    assert main(["tasks", "--db", store_url]) == 0
    shown = capsys.readouterr().out
    assert f"{task_id}" in shown
    assert "input_required deploy" in shown


def test_parked_children_hold_no_thread_the_count_is_flat_from_20_to_200(opened: Open) -> None:
    control = opened(
        ScriptedModel([DEPLOY]), [Deploys().tool], approval_grace_s=0.0, passivate_after_s=None
    )
    parent = control.agents.register("p1")

    def park(n: int) -> int:
        tasks = [start(control, parent, label=f"c{i}")[1] for i in range(n)]
        for task_id in tasks:
            asked(control, parent, task_id)
        wait_until(lambda: not any(
            t.name.startswith(THREAD_PREFIX) for t in threading.enumerate()
        ), "every run parked")  # fmt: skip
        # Idle pool workers (at most `LoopPool.max_idle`, whatever the load) hold no child.
        return sum(not t.name.startswith("actor-pool-idle") for t in threading.enumerate())

    with_20 = park(20)
    with_200 = park(180)
    assert with_200 <= with_20 + 2, (with_20, with_200)
    waiting = [t for t in control.tasks.list(parent) if t.status is TaskStatus.INPUT_REQUIRED]
    assert len(waiting) == 200


def test_a_runtime_without_the_childs_provider_steers_and_answers_and_one_with_it_goes_on(
    opened: Open, store_url: str
) -> None:
    """SPEC §9 "Work goes where the provider is": a console (no providers) steering a
    parked child is answered ``steered`` — the message written into the parked turn, once —
    and its answer is taken; the worker that has the provider carries both out."""
    deploys = Deploys()
    model = ScriptedModel([DEPLOY, "done"])
    holder = opened(model, [deploys.tool], approval_grace_s=0.05)
    parent = holder.agents.register("p1")
    child_id, task_id = start(holder, parent)
    request = asked(holder, parent, task_id).request
    assert request is not None
    wait_until(lambda: not loop_threads(child_id), "parked")

    with SubagentControl.open(store_url) as bare:  # a console: no providers
        console = bare.agents.register("p1")
        steered = bare.send_message(
            console, child_id, [TextBlock(text="also check the logs")], MessageSource(kind="human")
        )
        assert (steered.route, steered.task_id) == ("steered", task_id)
        bare.answer(console, request.id, allow=True, source=MessageSource(kind="human"))
        # The holder's sweep continues it; the console never fails it.
        done = settled(holder, parent, task_id)
    assert done.status is TaskStatus.COMPLETED
    assert deploys.runs == [{"env": "prod"}]
    assert holder.store is not None
    events = holder.store.load(child_id).events
    steers = [e for e in events if e.kind == EventKind.STEERING_MESSAGE]
    assert [(e.data["text"], e.source.kind if e.source else None) for e in steers] == [
        ("also check the logs", "human")
    ]
    assert steers[0].turn == events[-1].turn  # in the parked turn, which it then ended
    # The continued run's model read it.
    assert any("also check the logs" in m.text for m in model.calls[-1].messages)


def test_a_person_answers_from_the_command_line_and_a_runtime_goes_on(
    opened: Open, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from controlplane.cli import main

    deploys = Deploys()
    control = opened(ScriptedModel([DEPLOY, "done"]), [deploys.tool], approval_grace_s=0.05)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None
    wait_until(lambda: not loop_threads(child_id), "parked")

    assert main(["answer", "no-such-request", "--db", store_url, "--allow"]) == 3
    assert main(["answer", request.id, "--db", store_url, "--allow", "--note", "ok"]) == 0
    assert "allowed" in capsys.readouterr().out
    assert main(["answer", request.id, "--db", store_url, "--deny"]) == 1  # taken once
    done = settled(control, parent, task_id)
    assert done.status is TaskStatus.COMPLETED
    assert deploys.runs == [{"env": "prod"}]
    assert control.store is not None
    (answer,) = [e for e in control.store.load(child_id).events if e.kind == "approval/answer"]
    assert answer.source is not None
    assert answer.source.kind == "human"


def test_a_waiting_run_stopped_by_a_lost_lease_leaves_its_task_for_the_answer(
    opened: Open,
) -> None:
    deploys = Deploys()
    control = opened(ScriptedModel([DEPLOY, "done"]), [deploys.tool], approval_grace_s=30.0)
    parent = control.agents.register("p1")
    child_id, task_id = start(control, parent)
    request = asked(control, parent, task_id).request
    assert request is not None

    # The lease watchdog's path: stop acting, then (store reachable again) write what the
    # fenced Tasks left, and take new work again.
    fenced = "lease lost (test)"
    control._tasks.fence(fenced)
    wait_until(lambda: not loop_threads(child_id), "the fenced run stopped")
    wait_until(lambda: control._tasks.flush() == 0, "the fenced settlements written")
    control._tasks.readmit(fenced)

    assert control.store is not None
    stored = control.store.ledger.get(task_id)
    assert stored is not None
    assert stored.status is TaskStatus.INPUT_REQUIRED  # not interrupted: it waits
    control.answer(parent, request.id, allow=True)
    done = settled(control, parent, task_id)
    assert done.status is TaskStatus.COMPLETED
    assert deploys.runs == [{"env": "prod"}]


def test_a_wait_woken_by_an_approval_request_reads_input_required_never_running(
    opened: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waits racing the request: one woken as the request arrives must read the request's
    # view. Before, the entry woke its waiters first and rebuilt its view after, so a wait
    # could return ``running`` while the store read ``input_required``. The race is made
    # certain here: building the asking view waits (bounded) for a waiter to return.
    from controlplane.runtime.tasks._task_entry import TaskEntry

    build = TaskEntry._with
    returned = threading.Event()
    seen: list[TaskStatus] = []

    def slow_build(entry: TaskEntry, update: dict[str, Any]) -> TaskSnapshot:
        if update.get("request") is not None and not returned.is_set():
            returned.wait(0.5)  # a waiter that returns now read the view before this one
        return build(entry, update)

    monkeypatch.setattr(TaskEntry, "_with", slow_build)
    control = opened(ScriptedModel([DEPLOY, "done"]), [Deploys().tool], approval_grace_s=30.0)
    parent = control.agents.register("p1")
    _child_id, task_id = start(control, parent)

    def waiter() -> None:
        seen.append(control.tasks.wait(task_id, timeout=WAIT_S, requester=parent).status)
        returned.set()

    waiters = [threading.Thread(target=waiter) for _ in range(8)]
    for thread in waiters:
        thread.start()
    for thread in waiters:
        thread.join(WAIT_S * 2)
    assert seen == [TaskStatus.INPUT_REQUIRED] * 8


def test_an_answer_naming_a_huge_request_id_is_refused_without_echoing_it(opened: Open) -> None:
    # Before, the refusal (REQUEST_NOT_FOUND) quoted the whole 100,000-character id back.
    control = opened(ScriptedModel(["done"]), [])
    parent = control.agents.register("p1")
    huge = "r" * 100_000
    with pytest.raises(SubagentControlError) as refused:
        control.answer(parent, huge, allow=True)
    assert refused.value.code is ErrorCode.INVALID_INPUT
    assert "100000 characters" in refused.value.message
    assert len(str(refused.value)) < 500


def test_answered_requests_are_pruned_after_their_retention_and_waiting_ones_kept(
    opened: Open,
) -> None:
    # Before, every answered request stayed in the table for good (176 rows after 3,500
    # turns). The heartbeat's expiry prunes those done with a day ago; here the cut-off
    # is moved to now, which the retention would reach.
    from datetime import timedelta

    from controlplane.contract import utcnow
    from controlplane.runtime.lease._expiry import RETAIN_ANSWERED_S

    assert RETAIN_ANSWERED_S >= 3600
    control = opened(ScriptedModel([DEPLOY, "done", DEPLOY, "done"]), [Deploys().tool],
                     approval_grace_s=30.0)  # fmt: skip
    parent = control.agents.register("p1")
    _done_child, done_task = start(control, parent, label="answered")
    answered = asked(control, parent, done_task).request
    assert answered is not None
    control.answer(parent, answered.id, allow=True)
    assert settled(control, parent, done_task).status is TaskStatus.COMPLETED
    _child, waiting_task = start(control, parent, label="waiting")
    waiting = asked(control, parent, waiting_task).request
    assert waiting is not None
    store = control.store
    assert store is not None

    assert store.approvals.prune(utcnow() - timedelta(seconds=RETAIN_ANSWERED_S)) == 0
    assert store.approvals.prune(utcnow() + timedelta(seconds=1)) == 1
    with pytest.raises(SubagentControlError) as gone:
        store.approvals.state(answered.id)
    assert gone.value.code is ErrorCode.REQUEST_NOT_FOUND
    assert store.approvals.state(waiting.id)[0] == "open"
    control.answer(parent, waiting.id, allow=False)
    assert settled(control, parent, waiting_task).status is TaskStatus.COMPLETED
