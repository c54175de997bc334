"""The GenAI semantic conventions' ``gen_ai.client.token.usage``: a histogram in
``{token}``, one value per token type (``input``, ``output``) per model call whose server
reported tokens, with the operation, provider and model where known."""

from __future__ import annotations

import pytest

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    TaskStatus,
    TextBlock,
    Usage,
)
from tests.support import WAIT_S, MakeControl
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(60)

METRIC = "gen_ai.client.token.usage"


def test_each_reported_model_call_records_its_input_and_output_tokens(
    make_control: MakeControl, otel: Otel
) -> None:
    control = make_control(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    model = ScriptedModel(
        ["one", "two", "three"],
        usage=[Usage(input_tokens=100, output_tokens=7), None, Usage(input_tokens=50)],
    )
    control.providers.register(InProcessProvider(model))
    parent = control.agents.register("parent-1")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="counted", prompt=[TextBlock(text="go")], parent=parent,
            agent_provider="openai", agent_model="gpt-x",
        )
    )  # fmt: skip
    assert control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent).status is (
        TaskStatus.COMPLETED
    )
    for again in ("two", "three"):  # the second call reports nothing: not recorded
        sent = control.send_message(parent, started.child_id, [TextBlock(text=again)])
        control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)

    points = otel.points(METRIC)
    assert {attributes["gen_ai.token.type"] for attributes, _ in points} == {"input", "output"}
    for attributes, _point in points:
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "gpt-x"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.system"] == "openai"
    assert otel.count(METRIC, gen_ai__token__type="input") == 2
    assert otel.count(METRIC, gen_ai__token__type="output") == 2
    (inputs,) = [p for a, p in points if a["gen_ai.token.type"] == "input"]
    (outputs,) = [p for a, p in points if a["gen_ai.token.type"] == "output"]
    assert (inputs.sum, outputs.sum) == (150, 7)
    assert (inputs.min, inputs.max) == (50, 100)


def test_the_token_metric_is_a_histogram_in_tokens(make_control: MakeControl, otel: Otel) -> None:
    control = make_control(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    control.providers.register(
        InProcessProvider(ScriptedModel(["x"], usage=Usage(output_tokens=3)))
    )
    parent = control.agents.register("parent-1")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="x", prompt=[TextBlock(text="go")], parent=parent
        )
    )
    control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)

    data = otel.reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for m in scope.metrics
        if m.name == METRIC
    ]
    assert metric.unit == "{token}"
    assert type(metric.data).__name__ == "Histogram"
    # No model named, none known: the attribute is left out rather than made up.
    assert all("gen_ai.request.model" not in a for a, _ in otel.points(METRIC))
