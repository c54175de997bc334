"""A one-event append (a steer's record, a message): on SQLite it is one statement that
takes the next ``seq`` and checks the writer's claim itself; it must agree with the full
append on every store."""

from __future__ import annotations

import uuid

import pytest

from controlplane import ChildMeta, ErrorCode, NewEvent, SubagentControlError
from persistence import SqlStore

from .conftest import message


def _claimed_child(store: SqlStore, runtime: str = "runtime-a") -> str:
    child_id = str(uuid.uuid4())
    meta = ChildMeta(child_id=child_id, parent_session="parent-1", depth=1)
    store.create_child(meta, [message(1)], claim=(runtime, "task-1"))
    return child_id


def test_one_event_appends_stay_gapless_across_a_sealed_turn(store: SqlStore) -> None:
    child_id = _claimed_child(store)
    fence = ("runtime-a", 1)
    assert [e.seq for e in store.append(child_id, [message(2)], fence=fence)] == [2]
    end = NewEvent(kind="turn/end", turn=1, data={"status": "completed"})
    store.append(child_id, [end])  # seals the turn's rows: none left open
    written = store.append(child_id, [message(3, turn=2)])
    assert [e.seq for e in written] == [4]
    assert [e.seq for e in store.append(child_id, [message(4, turn=2)], fence=fence)] == [5]
    assert [e.seq for e in store.load(child_id).events] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("fence", [("runtime-a", 2), ("runtime-b", 1)])
def test_a_one_event_append_under_a_claim_not_held_writes_nothing(
    store: SqlStore, fence: tuple[str, int]
) -> None:
    child_id = _claimed_child(store)
    with pytest.raises(SubagentControlError) as refused:
        store.append(child_id, [message(2)], fence=fence)
    assert refused.value.code is ErrorCode.FENCED
    assert [e.seq for e in store.load(child_id).events] == [1]


def test_a_one_event_append_to_a_missing_child_is_not_found(store: SqlStore) -> None:
    with pytest.raises(SubagentControlError) as refused:
        store.append(str(uuid.uuid4()), [message(1)])
    assert refused.value.code is ErrorCode.CHILD_NOT_FOUND
