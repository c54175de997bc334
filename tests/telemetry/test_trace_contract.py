"""The actors see the telemetry only through the contract's interfaces: what the telemetry
builds must be what the actors' messages accept."""

from __future__ import annotations

from typing import Any

import pytest

from actors import ActivationPlan
from controlplane import AgentHandle, CancelSignal, MessageSource, TaskOutcome, TaskStatus
from controlplane.contract import NO_TRACE, ActivationTrace, AgentRegistry, TextBlock
from controlplane.telemetry import SpanTrace, Telemetry


@pytest.fixture
def parent() -> AgentHandle:
    return AgentRegistry().register("parent-1")


def plan(parent: AgentHandle, trace: ActivationTrace | None = None) -> ActivationPlan:
    """A plan as the runtime builds it, or (no ``trace``) as one built by hand."""
    fields: dict[str, Any] = {} if trace is None else {"trace": trace}
    return ActivationPlan(
        kind="initial",
        task_id="t-1",
        child_id="c-1",
        parent=parent,
        prompt=(TextBlock(text="hi"),),
        source=MessageSource(kind="user"),
        signal=CancelSignal(),
        label="a child",
        **fields,
    )


def test_an_admitted_activation_s_trace_is_the_contract_s_and_a_plan_carries_it(
    parent: AgentHandle,
) -> None:
    trace = Telemetry("r-1", enabled=False).activation(
        task_id="t-1", child_id="c-1", route="initial", origin=None, chars=2
    )

    assert isinstance(trace, SpanTrace)
    assert isinstance(trace, ActivationTrace)
    assert plan(parent, trace).trace is trace


def test_a_plan_built_by_hand_carries_the_null_trace_whose_hooks_do_nothing(
    parent: AgentHandle,
) -> None:
    by_hand = plan(parent)

    assert by_hand.trace is NO_TRACE
    with NO_TRACE.loading(), NO_TRACE.calling_provider(resumed=True), NO_TRACE.publishing():
        NO_TRACE.published()
    NO_TRACE.end(TaskOutcome(status=TaskStatus.COMPLETED, output="done"))
    NO_TRACE.end(None)
