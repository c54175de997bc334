"""What a load's decoder notes on the way (`Transcript`) equals what a walk over the events
finds, however the events are stored: open rows, sealed segments, both, on each backend."""

from __future__ import annotations

import copy
import pickle
import uuid

import pytest

from controlplane import ChildMeta, Descriptor, EventKind, NewEvent
from persistence import SqlStore
from persistence._codec import Transcript

from .conftest import message

DESCRIPTOR = Descriptor(provider="fake").to_event_data()


def _child(store: SqlStore, seed: list[NewEvent]) -> str:
    child_id = str(uuid.uuid4())
    meta = ChildMeta(child_id=child_id, parent_session="parent-1", depth=1, seed_length=len(seed))
    store.create_child(meta, seed)
    return child_id


def _walked(store: SqlStore, child_id: str) -> tuple[int, list[int]]:
    loaded = store.load(child_id)
    kinds = [e.kind for e in loaded.events]
    return loaded.last_turn, [i for i, kind in enumerate(kinds) if kind == EventKind.DESCRIPTOR]


def _noted(store: SqlStore, child_id: str) -> tuple[int, list[int]] | None:
    events = store.load(child_id).events
    assert isinstance(events, Transcript)
    return events.noted()


def _turn(turn: int, *, descriptor: bool = False, end: bool = True) -> list[NewEvent]:
    events = [NewEvent(kind=EventKind.TURN_START, turn=turn, data={})]
    if descriptor:
        events.append(NewEvent(kind=EventKind.DESCRIPTOR, turn=turn, data=DESCRIPTOR))
    events += [message(turn * 10 + i, turn=turn) for i in range(3)]
    if end:
        events.append(NewEvent(kind=EventKind.TURN_END, turn=turn, data={}))
    return events


@pytest.mark.parametrize("sealed", [True, False], ids=["segments-and-open", "open-rows"])
def test_the_noted_last_turn_and_descriptors_are_what_a_walk_finds(
    store: SqlStore, sealed: bool
) -> None:
    # A forked child: its seed (turn 0) holds a descriptor of the parent's too.
    seed = [
        message(1, turn=0),
        NewEvent(kind=EventKind.DESCRIPTOR, turn=0, data=DESCRIPTOR),
    ]
    child_id = _child(store, seed)
    for turn in (1, 2, 3):
        store.append(child_id, _turn(turn, descriptor=turn != 2, end=sealed))
    store.append(child_id, _turn(4, end=False))  # the last turn still open

    assert _noted(store, child_id) == _walked(store, child_id)
    assert _walked(store, child_id)[0] == 4


def test_the_last_turn_is_the_highest_even_when_turns_were_written_out_of_order(
    store: SqlStore,
) -> None:
    child_id = _child(store, [])
    store.append(child_id, _turn(5))
    store.append(child_id, _turn(2, descriptor=True))

    assert _noted(store, child_id) == _walked(store, child_id)
    assert _walked(store, child_id)[0] == 5


def test_a_child_without_events_has_turn_zero_and_no_descriptor(store: SqlStore) -> None:
    child_id = _child(store, [])

    assert _noted(store, child_id) == (0, [])


def test_a_changed_transcript_no_longer_vouches_for_what_was_noted(store: SqlStore) -> None:
    child_id = _child(store, [])
    store.append(child_id, _turn(1, descriptor=True))
    events = store.load(child_id).events
    assert isinstance(events, Transcript)

    events += store.load(child_id).events

    assert events.noted() is None


def test_the_loaded_events_stay_a_list_of_the_same_events(store: SqlStore) -> None:
    child_id = _child(store, [])
    store.append(child_id, _turn(1, descriptor=True))
    loaded = store.load(child_id)

    plain = list(loaded.events)
    assert loaded.events == plain
    assert loaded.own_events == plain
    assert type(loaded.own_events) is list
    again = pickle.loads(pickle.dumps(loaded))
    assert again == loaded
    assert again.events.noted() == (1, [1])
    assert copy.deepcopy(loaded) == loaded
    assert loaded.model_dump()["events"] == [e.model_dump() for e in plain]
