"""Budgets with ACP children (SPEC §11): an agent subprocess runs its turn on its own (there
is no call to gate inside it), but the usage it reports counts, and a send to a child past
its budget is refused before any agent process starts, until its parent raises it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import (
    Budget,
    ContinuableStartSpec,
    ErrorCode,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)

pytest.importorskip("acp", reason="the acp extra is not installed")

from tests.providers.test_acp_provider import Agents, reaped, register

WAIT_S = 15.0
REPORTED = {"totalTokens": 75, "inputTokens": 50, "outputTokens": 25}


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    yield from reaped(Agents(tmp_path / "agent-state"))


@pytest.fixture
def control(store_url: str) -> Iterator[SubagentControl]:
    with SubagentControl.open(store_url) as opened:
        yield opened


def test_an_acp_childs_reported_usage_counts_and_a_send_past_its_budget_is_refused(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--usage", json.dumps(REPORTED))
    parent = control.agents.register("parent-1")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="acp", label="acp child", prompt=[TextBlock(text="count")],
            parent=parent, budget=Budget(tokens=50),
        )
    )  # fmt: skip
    first = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    assert first.status is TaskStatus.COMPLETED  # the agent's turn is its own
    prompted = len(agents.prompts())

    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, started.child_id, [TextBlock(text="more")])

    assert caught.value.code is ErrorCode.BUDGET_EXHAUSTED
    assert "token budget of 50 spent: 75" in caught.value.message
    assert len(agents.prompts()) == prompted  # no agent was asked anything
    assert len(control.tasks.list(parent)) == 1
    control.set_budget(parent, started.child_id, Budget(tokens=500))
    sent = control.send_message(parent, started.child_id, [TextBlock(text="more")])
    again = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert again.status is TaskStatus.COMPLETED
    assert control.usage(parent, started.child_id).total_tokens == 150
