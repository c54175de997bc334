"""One ``error.type`` per failure across a trace: a span that failed under an activation
takes the code that settled the Task, whatever its own raise was; a failure settled
without a code keeps the raise's on both."""

from __future__ import annotations

import pytest

from controlplane import ErrorCode, SubagentControlError, TaskOutcome, TaskStatus
from controlplane.telemetry import Telemetry
from tests.telemetry.conftest import Otel

pytestmark = pytest.mark.timeout(30)


def _failed_load(otel: Otel, outcome: TaskOutcome) -> tuple[dict[str, object], ...]:
    telemetry = Telemetry("rt-1", tracer_provider=otel.tracer_provider)
    trace = telemetry.activation(
        task_id="t-1", child_id="c-1", route="resumed", origin=None, chars=2
    )
    with pytest.raises(SubagentControlError), trace.loading():
        raise SubagentControlError(ErrorCode.CHILD_NOT_FOUND, "no child c-1")
    # Not ended yet: it waits for the code that settles the Task.
    assert otel.spans("subagent.load") == []
    trace.end(outcome)
    (load,) = otel.spans("subagent.load")
    (activation,) = otel.spans("subagent.activation")
    assert load.status.status_code.name == "ERROR"
    assert load.end_time < activation.end_time  # ended with the time it failed
    return dict(load.attributes or {}), dict(activation.attributes or {})


def test_a_load_that_failed_reads_the_code_that_settled_the_task(otel: Otel) -> None:
    settled = TaskOutcome(
        status=TaskStatus.FAILED, detail="child c-1 is unavailable", code=ErrorCode.NOT_RESUMABLE
    )
    load, activation = _failed_load(otel, settled)
    assert load["error.type"] == activation["error.type"] == "NOT_RESUMABLE"


def test_a_failure_settled_without_a_code_reads_the_raise_s_on_both(otel: Otel) -> None:
    settled = TaskOutcome(status=TaskStatus.FAILED, detail="no child c-1")
    load, activation = _failed_load(otel, settled)
    assert load["error.type"] == activation["error.type"] == "CHILD_NOT_FOUND"
