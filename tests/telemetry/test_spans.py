"""Spans: a start, a steer, a kill, a resume and a failed turn, each traced under the
caller's span (the parent's tool call), with the activation's phases under it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    SubagentControl,
    SubagentResult,
)
from controlplane.aio import AsyncSubagentControl
from tests.fakes import FakeProvider
from tests.support import raises, running_child, settle, start_child, text
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(60)


def _one(spans: list[Any], **attributes: object) -> Any:
    """The one span whose attributes include ``attributes``."""
    found = [s for s in spans if all(s.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (attributes, [dict(s.attributes) for s in spans])
    return found[0]


def _children(otel: Otel, parent: Any) -> list[str]:
    ctx = parent.context
    return sorted(
        s.name for s in otel.spans() if s.parent is not None and s.parent.span_id == ctx.span_id
    )


def test_a_child_s_life_is_traced_under_the_callers_spans(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
    otel: Otel,
) -> None:
    harness = otel.tracer_provider.get_tracer("harness")
    with harness.start_as_current_span("tool subagent") as tool_call:
        child_id, first_task, _plan = running_child(control, parent, provider, hold)
    with harness.start_as_current_span("tool send_message"):
        steered = control.send_message(parent, child_id, text("also this"))
    control.tasks.kill(first_task, requester=parent)
    settle(control, first_task, parent)
    with harness.start_as_current_span("tool send_message") as resume_call:
        resumed = control.send_message(parent, child_id, text("go on"))
    settle(control, resumed.task_id, parent)
    provider.plan(result=SubagentResult(stop_reason="max-tokens"))
    failing = control.send_message(parent, child_id, text("and fail"))
    settle(control, failing.task_id, parent)

    assert steered.route == "steered"
    start = otel.spans("subagent.start")[0]
    assert start.parent is not None
    assert start.parent.span_id == tool_call.get_span_context().span_id
    assert start.attributes["gen_ai.agent.id"] == child_id
    assert start.attributes["gen_ai.operation.name"] == "create_agent"
    assert start.attributes["subagent.task.id"] == first_task

    activations = otel.spans("subagent.activation")
    initial = _one(activations, **{"subagent.task.id": first_task})
    assert initial.parent.span_id == start.context.span_id
    assert initial.context.trace_id == tool_call.get_span_context().trace_id
    assert [link.context.span_id for link in initial.links] == [
        tool_call.get_span_context().span_id
    ]
    assert initial.attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.id": child_id,
        "subagent.task.id": first_task,
        "subagent.route": "initial",
        "subagent.runtime.id": control.runtime_id,
        "subagent.provider": "fake",
        "gen_ai.request.model": "m1",
        "gen_ai.provider.name": "acme",
        "subagent.outcome.status": "killed",
        "subagent.outcome.detail": "killed by parent-1",
        "error.type": "CANCELLED",
    }
    assert _children(otel, initial) == [
        "subagent.dispose",
        "subagent.provider.start",
        "subagent.publish",
    ]
    steer_events = [e for e in initial.events if e.name == "subagent.steered"]
    sends = otel.spans("subagent.send")
    steer_send = _one(sends, **{"subagent.route": "steered"})
    # The event names the send that steered; the send links to the activation.
    assert [dict(e.attributes) for e in steer_events] == [
        {
            "subagent.message.chars": len("also this"),
            "subagent.message.source": "coordinator",
            "subagent.send.trace_id": format(steer_send.context.trace_id, "032x"),
            "subagent.send.span_id": format(steer_send.context.span_id, "016x"),
        }
    ]
    assert [link.context.span_id for link in steer_send.links] == [initial.context.span_id]

    assert steer_send.attributes["subagent.task.id"] == first_task
    assert steer_send.attributes["subagent.message.chars"] == len("also this")

    resumed_span = _one(activations, **{"subagent.task.id": resumed.task_id})
    resume_send = _one(sends, **{"subagent.task.id": resumed.task_id})
    assert resume_send.attributes["subagent.route"] == "started"
    assert resume_send.parent.span_id == resume_call.get_span_context().span_id
    assert resumed_span.parent.span_id == resume_send.context.span_id
    assert resumed_span.attributes["subagent.route"] == "resumed"
    assert resumed_span.attributes["subagent.outcome.status"] == "completed"
    assert resumed_span.attributes["subagent.provider"] == "fake"
    assert _children(otel, resumed_span) == [
        "subagent.dispose",
        "subagent.load",
        "subagent.provider.resume",
        "subagent.publish",
    ]

    failed = _one(activations, **{"subagent.task.id": failing.task_id})
    assert failed.attributes["subagent.outcome.status"] == "failed"
    assert failed.attributes["subagent.outcome.detail"] == "max-tokens"
    assert failed.status.status_code.name == "ERROR"
    assert failed.status.description == "max-tokens"
    # Sent outside any span of the harness: its send span starts a trace of its own.
    assert _one(sends, **{"subagent.task.id": failing.task_id}).parent is None


def test_a_refused_send_is_a_span_with_its_error_code(
    control: SubagentControl, parent: AgentHandle, otel: Otel
) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, "", text("hello"))

    (send,) = otel.spans("subagent.send")
    assert send.attributes["error.type"] == "INVALID_INPUT"
    assert send.status.status_code.name == "ERROR"
    assert otel.spans("subagent.activation") == []


def test_a_provider_that_fails_to_start_marks_its_phase_and_the_activation_failed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, otel: Otel
) -> None:
    provider.plan(fail_start=RuntimeError("no model today"))
    task_id = start_child(control, parent).task_id
    settle(control, task_id, parent)

    (activation,) = otel.spans("subagent.activation")
    assert activation.attributes["subagent.outcome.status"] == "failed"
    assert activation.attributes["subagent.outcome.detail"] == "no model today"
    (call,) = otel.spans("subagent.provider.start")
    assert call.parent is not None
    assert call.parent.span_id == activation.context.span_id
    assert call.status.status_code.name == "ERROR"
    assert call.attributes["error.type"] == "RuntimeError"
    assert activation.attributes["error.type"] == "RuntimeError"  # one per failure
    assert otel.spans("subagent.publish") == []


def test_an_async_caller_s_span_is_the_parent_of_its_start(
    control: SubagentControl, parent: AgentHandle, otel: Otel
) -> None:
    harness = otel.tracer_provider.get_tracer("harness")
    front = AsyncSubagentControl(control)

    async def tool_call() -> tuple[Any, str]:
        with harness.start_as_current_span("async tool subagent") as span:
            spec = ContinuableStartSpec(
                provider="fake", label="async", prompt=text("go"), parent=parent
            )
            started = await front.start_continuable(spec)
        return span, started.task_id

    tool, task_id = asyncio.run(tool_call())
    settle(control, task_id, parent)

    (start,) = otel.spans("subagent.start")
    assert start.parent is not None
    assert start.parent.span_id == tool.get_span_context().span_id
