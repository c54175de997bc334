"""What children spent, in the CLI's views: ``children --db`` and ``tasks --db`` (text and
``--json``), the ``transcript`` header, and ``top`` 's per-activation tokens and cost. The
offline views run in a fresh interpreter, as an operator runs them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from controlplane import (
    ActorTree,
    ContinuableStartSpec,
    InProcessProvider,
    Price,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.cli._top import render
from controlplane.contract import ActivationNode, SupervisorNode
from tests.support import WAIT_S, run_python

SPENT = Usage(input_tokens=1200, output_tokens=34, model_calls=1, cost=1.268)


def populated(store_url: str) -> tuple[str, str]:
    """A child that spent ``SPENT`` in its one turn; its id and its Task's."""
    prices = {"m": Price(input=1_000, output=2_000)}  # $0.001 a token in, $0.002 out
    with SubagentControl.open(store_url, prices=prices) as control:
        model = ScriptedModel(["done"], usage=Usage(input_tokens=1200, output_tokens=34))
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register("parent-1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="spender", prompt=[TextBlock(text="go")],
                parent=parent, agent_model="m",
            )
        )  # fmt: skip
        done = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED
    return started.child_id, started.task_id


def cli(*argv: str) -> str:
    ran = run_python("-m", "controlplane.cli", *argv, timeout=60)
    assert (ran.returncode, ran.stderr) == (0, ""), ran
    return ran.stdout


@pytest.mark.slow  # measured: 18 s under load (--durations)
def test_children_and_tasks_show_what_each_spent_as_text_and_json(store_url: str) -> None:
    child_id, task_id = populated(store_url)

    header, row = cli("children", "--db", store_url).splitlines()
    assert header.split()[4:7] == ["TOKENS", "CALLS", "COST"]
    assert row.split()[4:8] == ["1,234", "1", "$1.2680", "spender"]
    (record,) = [
        json.loads(line) for line in cli("children", "--db", store_url, "--json").splitlines()
    ]
    assert record["child_id"] == child_id
    assert Usage.model_validate(record["usage"]) == SPENT

    header, row = cli("tasks", "--db", store_url).splitlines()
    assert header.split()[6:9] == ["TOKENS", "CALLS", "COST"]
    assert row.split()[0] == task_id
    assert row.split()[6:10] == ["1,234", "1", "$1.2680", "spender"]
    (task,) = [json.loads(line) for line in cli("tasks", "--db", store_url, "--json").splitlines()]
    assert Usage.model_validate(task["usage"]) == SPENT


def test_the_transcript_header_says_what_the_child_spent(store_url: str) -> None:
    child_id, _task_id = populated(store_url)

    first = cli("transcript", child_id, "--db", store_url).splitlines()[0]

    assert "tokens=1,234  model_calls=1  tool_calls=0  cost=$1.2680" in first
    events = [
        json.loads(line)
        for line in cli("transcript", child_id, "--db", store_url, "--json").splitlines()
    ]
    (reply,) = [e for e in events if e["kind"] == "assistant/message"]
    assert Usage.model_validate(reply["data"]["usage"]) == SPENT


def test_top_shows_each_activations_tokens_and_cost_and_a_dash_for_an_unknown_cost() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def node(child: str, usage: Usage) -> SupervisorNode:
        return SupervisorNode(
            child_id=child, parent_session="p", state="running", task_id=f"t-{child}",
            task_status="running", last_activity=now,
            activation=ActivationNode(
                task_id=f"t-{child}", kind="initial", published=True, task_status="running",
                age_s=1.0, usage=usage,
            ),
        )  # fmt: skip

    tree = ActorTree(
        taken_at=now,
        closed=False,
        supervisors=[
            node("priced", Usage(input_tokens=12_000, output_tokens=345, cost=0.0312)),
            node("unpriced", Usage(input_tokens=7, model_calls=1)),
        ],
    )

    lines = render(tree, source="here")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["priced"][5:7] == ["12,345", "$0.0312"]  # after the QUEUE column
    assert rows["unpriced"][5:7] == ["7", "-"]
    assert "activation t-priced (initial, published, running, age 1.0s) tokens=12345 calls=0" in (
        tree.render()
    )
