"""SPEC §5 start_continuable 1: synchronous validation leaves no Task and no association."""

from __future__ import annotations

import math
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    SubagentControl,
)
from tests.fakes import FakeProvider
from tests.support import MakeControl, raises, start_child, task_ids, text


def assert_nothing_left(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    assert task_ids(control, parent.session_id) == []
    assert control.dump_tree().supervisors == []
    assert provider.starts == []
    if control.store is not None:
        assert control.store.list_children(parent.session_id) == []


def test_closed_control_plane_refuses_start_with_closed_before_anything_else(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    parent.dispose()
    control.close()

    with raises(ErrorCode.CLOSED):
        start_child(control, parent, provider="nobody", inputs={"bad": {1, 2}})
    assert provider.starts == []


def test_unknown_provider_leaves_no_task_and_no_association(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    with raises(ErrorCode.UNKNOWN_PROVIDER):
        start_child(control, parent, provider="nobody")
    assert_nothing_left(control, parent, provider)


def test_missing_store_is_persistence_unavailable(provider: FakeProvider) -> None:
    with SubagentControl(None) as control:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")

        with raises(ErrorCode.PERSISTENCE_UNAVAILABLE):
            start_child(control, parent)
        assert task_ids(control, parent) == []
        assert control.dump_tree().supervisors == []
        assert provider.starts == []


NOT_JSON: list[Any] = [
    {1, 2},
    frozenset({"a"}),
    b"bytes",
    bytearray(b"x"),
    object(),
    math.nan,
    math.inf,
    -math.inf,
    [1, {"deep": {"er": math.nan}}],
    {"nested": [b"x"]},
    complex(1, 2),
]


@pytest.mark.parametrize("value", NOT_JSON, ids=lambda v: type(v).__name__ + repr(v)[:12])
@pytest.mark.parametrize("field", ["inputs", "tool_filter"])
def test_non_json_inputs_are_invalid_descriptor(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    field: str,
    value: Any,
) -> None:
    with raises(ErrorCode.INVALID_DESCRIPTOR):
        fields: dict[str, Any] = {field: {"key": value}}
        start_child(control, parent, **fields)
    assert_nothing_left(control, parent, provider)


def test_no_control_surface_when_task_tools_are_off(
    make_control: MakeControl, provider: FakeProvider
) -> None:
    control = make_control(task_tools=False)
    parent = control.agents.register("parent-1")

    with raises(ErrorCode.NO_CONTROL_SURFACE):
        start_child(control, parent)
    assert_nothing_left(control, parent, provider)


def test_dead_parent_is_unauthorized(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    parent.dispose()

    with raises(ErrorCode.UNAUTHORIZED):
        start_child(control, parent)
    assert_nothing_left(control, parent, provider)


def test_a_failed_validation_does_not_disturb_a_later_start(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    with raises(ErrorCode.INVALID_DESCRIPTOR):
        start_child(control, parent, inputs={"k": math.nan})

    started = control.start_continuable(
        ContinuableStartSpec(provider="fake", label="ok", prompt=text("go"), parent=parent)
    )

    assert task_ids(control, parent) == [started.task_id]
