"""A steer's record made by `steering_record` (checked where the steer is taken, written as
it is) is stored as the same `NewEvent` appended through the checked path would be, and
refuses what that path refuses, with the same error."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    SubagentControlError,
)
from persistence import SqlStore, steering_record
from tests.persistence.conftest import new_child

SOURCE = MessageSource(kind="coordinator", sender_session_id="parent-1")


def _event(turn: Any, text: Any, source: Any, forwarded: Any = None) -> dict[str, Any]:
    """The same record as a plain mapping: the checked path validates every field of it."""
    data = {"text": text} if forwarded is None else {"text": text, "forwarded": forwarded}
    return {"kind": EventKind.STEERING_MESSAGE, "turn": turn, "data": data, "source": source}


@pytest.mark.parametrize("forwarded", [None, "inbox-7"], ids=["local", "forwarded"])
@pytest.mark.parametrize("text", ["keep seq gapless", "naïve café ✓", "nul \x00 inside", ""])
def test_a_record_is_stored_as_the_same_event_appended_through_the_checked_path(
    store: SqlStore, text: str, forwarded: str | None
) -> None:
    fast, checked = new_child(store).child_id, new_child(store).child_id

    written = store.append(fast, [steering_record(3, text, SOURCE, forwarded)])
    expected = store.append(checked, [NewEvent.model_validate(_event(3, text, SOURCE, forwarded))])

    def shape(events: list[Any]) -> list[tuple[Any, ...]]:
        return [(e.seq, e.turn, e.kind, e.data, e.source) for e in events]

    assert shape(written) == shape(expected)
    assert shape(store.load(fast).events) == shape(store.load(checked).events)


def test_records_of_several_steers_are_written_in_one_batch_in_order(store: SqlStore) -> None:
    child = new_child(store).child_id
    records = [steering_record(1, f"steer {n}", SOURCE) for n in range(3)]

    store.append(child, [*records, NewEvent(kind="assistant/message", turn=1, data={"n": 1})])

    loaded = store.load(child).events
    assert [e.data for e in loaded] == [
        {"text": "steer 0"},
        {"text": "steer 1"},
        {"text": "steer 2"},
        {"n": 1},
    ]
    assert [e.seq for e in loaded] == [1, 2, 3, 4]


BAD = [
    pytest.param(1, "lone surrogate \ud800", SOURCE, None, id="surrogate-text"),
    pytest.param(1, "ok", SOURCE, "inbox \udfff", id="surrogate-inbox-id"),
    pytest.param(
        1,
        "ok",
        MessageSource.model_construct(kind="coordinator", sender_session_id="\ud800"),
        None,
        id="surrogate-sender",
    ),
    pytest.param(-1, "ok", SOURCE, None, id="negative-turn"),
    pytest.param(2**31, "ok", SOURCE, None, id="turn-beyond-the-column"),
]


@pytest.mark.parametrize(("turn", "text", "source", "forwarded"), BAD)
def test_a_bad_record_is_refused_as_the_checked_path_refuses_the_same_event(
    store: SqlStore, turn: Any, text: Any, source: Any, forwarded: Any
) -> None:
    child = new_child(store).child_id

    with pytest.raises(SubagentControlError) as checked:
        store.append(child, [_event(turn, text, source, forwarded)])
    with pytest.raises(SubagentControlError) as fast:
        store.append(child, [steering_record(turn, text, source, forwarded)])

    assert checked.value.code is ErrorCode.INVALID_INPUT
    assert (fast.value.code, fast.value.message) == (checked.value.code, checked.value.message)
    assert store.load(child).events == []
