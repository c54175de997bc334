"""Text the store cannot keep (SPEC §5 start 1, send_message 4, §8 bad input): a lone surrogate
cannot be encoded as UTF-8, and the store refuses NUL in a label and labels over 1,000
characters. Such input is refused up front with its code, before any Task, provider call or
delivery — not discovered by the store after the run already has it (fixed in 932ce81)."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from tests.fakes import FakeProvider
from tests.support import (
    events,
    eventually,
    idle_child,
    is_durable,
    raises,
    running_child,
    text,
)

LONE_SURROGATE = "half a pair: \ud83d"


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def spec(parent: AgentHandle, **fields: object) -> ContinuableStartSpec:
    base: dict[str, object] = {
        "provider": "fake",
        "label": "research X",
        "prompt": text("go"),
        "parent": parent,
    }
    return ContinuableStartSpec(**{**base, **fields})  # type: ignore[arg-type]


def test_text_that_is_plain_unicode_however_odd_round_trips_through_a_start_and_a_steer(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> None:
    odd = "RTL \u202eevil\u202c, NUL \x00, BOM \ufeff, emoji \U0001f600, combining \u0301"
    provider.plan(result_gate=hold)
    start = control.start_continuable(
        spec(parent, prompt=text(odd), persona=odd, inputs={odd: [odd]})
    )
    eventually(lambda: is_durable(control, start.child_id), "the run is published")

    assert control.send_message(parent, start.child_id, text(odd)).route == "steered"

    stored = events(control, start.child_id)
    assert stored[1].data == {"text": odd}
    assert stored[2].data["persona"] == odd
    assert stored[2].data["inputs"] == {odd: [odd]}
    assert [e.data for e in stored if e.kind == EventKind.STEERING_MESSAGE] == [{"text": odd}]


@pytest.mark.parametrize("label", ["x" * 1001, "a\x00b", LONE_SURROGATE])
def test_a_label_the_store_cannot_keep_is_refused_before_any_task_exists(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, label: str
) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        control.start_continuable(spec(parent, label=label))
    assert control.tasks.list(parent) == []
    assert provider.starts == []


@pytest.mark.parametrize("field", ["persona", "inputs", "tool_filter"])
def test_a_descriptor_holding_a_lone_surrogate_is_refused_as_invalid_descriptor(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, field: str
) -> None:
    value: object = LONE_SURROGATE if field == "persona" else {"allow": [LONE_SURROGATE]}
    with raises(ErrorCode.INVALID_DESCRIPTOR):
        control.start_continuable(spec(parent, **{field: value}))
    assert control.tasks.list(parent) == []
    assert provider.starts == []


def test_a_prompt_holding_a_lone_surrogate_is_refused_before_any_task_exists(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        control.start_continuable(spec(parent, prompt=[TextBlock(text=LONE_SURROGATE)]))
    assert provider.starts == []


def test_a_steer_holding_a_lone_surrogate_is_refused_before_the_running_turn_takes_it(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> None:
    child_id, _, _ = running_child(control, parent, provider, hold)

    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, child_id, text(LONE_SURROGATE))
    # Every delivered message is in the transcript (§5 send_message 4): so this one must not
    # have been delivered.
    assert provider.steered_texts(child_id) == []


def test_a_follow_up_holding_a_lone_surrogate_is_refused_before_a_task_starts(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)

    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, child_id, text(LONE_SURROGATE))
    assert provider.resumes == []
    assert [t.status for t in control.tasks.list(parent)] == [TaskStatus.COMPLETED]


@pytest.mark.parametrize(
    "inputs", [{"\ud800": 1}, {"x": [{"\udfff": 1}]}], ids=["top-level key", "nested key"]
)
def test_a_descriptor_with_a_lone_surrogate_in_a_key_is_refused_as_invalid_descriptor(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, inputs: object
) -> None:
    with raises(ErrorCode.INVALID_DESCRIPTOR):
        control.start_continuable(spec(parent, inputs=inputs))
    assert control.tasks.list(parent) == []
    assert provider.starts == []
