"""A store keeps what its loads decoded and reads only what came after: a load still finds
every event any writer committed since (another store, another runtime), sealed or open,
and reads back what a fresh store reads."""

from __future__ import annotations

import pytest

from controlplane import EventKind, NewEvent
from persistence import SqlStore
from persistence import _transcripts as transcripts
from persistence._codec import Transcript
from persistence._transcripts import TranscriptCache, weigh
from tests.persistence.conftest import message, new_child


def _frame(turn: int) -> list[NewEvent]:
    return [
        NewEvent(kind=EventKind.TURN_START, turn=turn, data={}),
        NewEvent(kind=EventKind.USER_MESSAGE, turn=turn, data={"text": f"go {turn}"}),
    ]


def _end(turn: int) -> list[NewEvent]:
    return [NewEvent(kind=EventKind.TURN_END, turn=turn, data={"status": "completed"})]


def test_a_kept_child_loads_what_another_store_wrote_since_as_a_fresh_store_does(
    store: SqlStore, store_url: str
) -> None:
    child = new_child(store).child_id
    descriptor = NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data={"version": 1})
    store.append(child, [*_frame(1), descriptor])
    assert len(store.load(child).events) == 3  # kept: turn 1 open
    with SqlStore(store_url) as other:
        writes = [
            [message(1)],
            _end(1),  # seals turn 1: events this store kept open, now in a segment
            [*_frame(2), message(2)],
            [message(3, turn=2), *_end(2)],
            _frame(3),
            [message(4, turn=3)],
        ]
        for batch in writes:
            other.append(child, batch)
            with SqlStore(store_url) as fresh:
                expected = fresh.load(child)
            loaded = store.load(child)
            assert loaded == expected
            assert loaded.events.noted() == expected.events.noted()  # type: ignore[attr-defined]
            assert loaded.last_turn == expected.last_turn


def test_a_load_hands_out_a_list_of_its_own(store: SqlStore) -> None:
    child = new_child(store).child_id
    store.append(child, [*_frame(1), message(1)])
    first = store.load(child).events
    first.clear()
    assert len(store.load(child).events) == 3


def test_the_kept_transcripts_stay_within_their_bounds(store: SqlStore) -> None:
    children = [new_child(store).child_id for _ in range(3)]
    for child in children:
        store.append(child, [*_frame(1), message(1)])
    cache = TranscriptCache(max_children=2, max_events=5)
    for child in children:
        cache.keep(child, None, _decoded(store, child))
    assert len(cache) == 1  # three events each: two would hold six
    assert cache.get(children[-1]) is not None
    big = TranscriptCache(max_events=2)
    kept = _decoded(store, children[0])
    assert big.keep(children[0], None, kept) is kept  # too long to keep: handed out
    assert len(big) == 0


def _decoded(store: SqlStore, child_id: str) -> Transcript:
    events = store.load(child_id).events
    assert isinstance(events, Transcript)
    return events


def test_the_kept_transcripts_are_bounded_by_their_weight_not_only_their_count(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A few children with long tool outputs weigh what thousands of short events do: the
    # cache keeps what fits the weight and hands the rest out, whatever their count.
    long_text = "x" * 40_000
    monkeypatch.setattr(transcripts, "MAX_BYTES", 100_000)
    with SqlStore(store.url) as small:  # its cache takes the bound when the store is made
        cache = small._transcripts
        children = [new_child(small).child_id for _ in range(4)]
        for child in children:
            small.append(child, [*_frame(1), _said(long_text)])
            decoded = _decoded(small, child)
            assert decoded.stored_bytes > len(long_text)
            assert cache.weight <= 100_000
        assert len(cache) == 2  # two of ~40 KB each fit, the older went first
        assert cache.weight == sum(weigh(_kept(cache, c)) for c in children[-2:])
        for child in children:  # evicted or kept, a load reads the same
            assert [e.data for e in small.load(child).events][-1] == {"text": long_text}
    heavy = TranscriptCache(max_bytes=10_000)
    kept = _decoded(store, children[0])
    assert heavy.keep(children[0], None, kept) is kept  # too heavy to keep: handed out
    assert len(heavy) == 0
    assert heavy.weight == 0


def _said(text: str) -> NewEvent:
    return NewEvent(kind=EventKind.USER_MESSAGE, turn=1, data={"text": text})


def _kept(cache: TranscriptCache, child_id: str) -> Transcript:
    kept = cache.get(child_id)
    assert kept is not None
    return kept
