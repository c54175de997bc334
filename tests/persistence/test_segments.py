"""Sealed turns: the append that ends a turn packs the child's open rows into segment rows,
and every event reads back exactly as it was, on both backends."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane import ChildMeta, EventKind, MessageSource, NewEvent
from controlplane.contract._json import MAX_DEPTH
from persistence import RetryPolicy, SqlStore
from persistence._codec import decode_events, to_json
from persistence._schema import SCHEMA_VERSION
from persistence._segments import SEGMENT_CHARS, SEGMENT_EVENTS, decode_segment, seal
from tests.persistence.conftest import (
    LostAck,
    RetryLog,
    as_version_1,
    json_values,
    message,
    new_child,
    raw_engine,
    recording,
    transient_error,
)
from tests.support import SqliteStatements

USER = MessageSource(kind="user")
HUMAN = MessageSource(kind="human", sender_session_id="parent-1")


def turn_end(turn: int = 1) -> NewEvent:
    return NewEvent(kind=EventKind.TURN_END, turn=turn, data={"status": "completed"})


def varied(turn: int = 1) -> list[NewEvent]:
    """Events whose data takes every path the store's JSON has."""
    return [
        NewEvent(kind=EventKind.TURN_START, turn=turn, data={"task_id": "t"}),
        NewEvent(kind=EventKind.USER_MESSAGE, turn=turn, data={"text": "go"}, source=USER),
        NewEvent(kind="assistant/message", turn=turn, data={"text": 'héllo \u2603 "q" \\ \n'}),
        NewEvent(kind=EventKind.STEERING_MESSAGE, turn=turn, data={"t": "x"}, source=HUMAN),
        NewEvent(kind="tool/result", turn=turn, data={"big": 2**80, "neg": -(2**70)}),
        NewEvent(kind='odd "kind" ✓', turn=turn, data=None),
        NewEvent(kind="k", turn=turn, data=[1.5, -0.0, 1e300, True, {"": []}]),
        NewEvent(kind="deep", turn=turn, data=nested(MAX_DEPTH)),  # two levels more, sealed
    ]


def nested(levels: int) -> object:
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def stored_rows(url: str, child_id: str) -> tuple[int, list[tuple[int, int]]]:
    """The child's open rows, and the ``(first_seq, last_seq)`` of its segments."""
    engine = raw_engine(url)
    with engine.connect() as conn:
        open_rows = conn.execute(
            sa.text("SELECT count(*) FROM subagent_events WHERE child_id = :c"), {"c": child_id}
        ).scalar_one()
        segments = conn.execute(
            sa.text(
                "SELECT first_seq, last_seq FROM subagent_segments WHERE child_id = :c "
                "ORDER BY first_seq"
            ),
            {"c": child_id},
        ).all()
    engine.dispose()
    return int(open_rows), [(row[0], row[1]) for row in segments]


def test_a_turn_end_seals_the_turn_and_every_event_reads_back_as_it_was(
    store: SqlStore, store_url: str
) -> None:
    meta = new_child(store)
    written = store.append(meta.child_id, varied())
    before = store.load(meta.child_id).events
    assert stored_rows(store_url, meta.child_id) == (len(written), [])

    ended = store.append(meta.child_id, [turn_end()])

    after = store.load(meta.child_id).events
    assert after == [*before, *ended]  # seq, turn, kind, data, source and created_at
    assert after[4].data == {"big": 2**80, "neg": -(2**70)}  # the exact path, still exact
    assert isinstance(after[4].data["big"], int)
    assert stored_rows(store_url, meta.child_id) == (0, [(1, len(after))])


def test_appends_after_a_seal_continue_the_sequence_and_seal_again_at_the_next_turn_end(
    store: SqlStore, store_url: str
) -> None:
    meta = new_child(store)
    store.append(meta.child_id, [*varied(1), turn_end(1)])
    first_turn = len(varied()) + 1

    stored = store.append(meta.child_id, varied(2)[:2])
    assert [e.seq for e in stored] == [first_turn + 1, first_turn + 2]
    assert stored_rows(store_url, meta.child_id) == (2, [(1, first_turn)])
    assert [e.seq for e in store.load(meta.child_id).events] == list(range(1, first_turn + 3))

    store.append(meta.child_id, [turn_end(2)])
    assert stored_rows(store_url, meta.child_id) == (
        0,
        [(1, first_turn), (first_turn + 1, first_turn + 3)],
    )
    assert [e.seq for e in store.load(meta.child_id).events] == list(range(1, first_turn + 4))
    assert store.append(meta.child_id, [message(9)])[0].seq == first_turn + 4


class EventWrites(SqliteStatements):
    """What committed transactions did to the open rows (SQLite): ``INSERT``, ``DELETE``."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def counts(self, statements: Sequence[str], *, transaction: bool) -> bool:
        for statement in statements:
            words = statement.split()
            if words[0] in ("INSERT", "DELETE") and words[2] == "subagent_events":
                self.writes.append(words[0])
        return False


def test_a_batch_that_ends_its_turn_is_sealed_without_becoming_open_rows(
    store_url: str, sqlite_url: str
) -> None:
    with EventWrites() as traced, SqlStore(store_url) as store:
        meta = new_child(store)
        opened = store.append(meta.child_id, varied()[:2])  # the turn's frame: open rows
        before = len(traced.writes)
        ended = store.append(meta.child_id, [*varied()[2:], turn_end()])
        if store_url == sqlite_url:
            # The frame's rows are deleted; the ending batch's events were never inserted.
            assert traced.writes[before:] == ["DELETE"]
        assert [e.seq for e in ended] == list(range(3, len(varied()) + 2))
        assert store.load(meta.child_id).events == [*opened, *ended]  # every field as written
        assert stored_rows(store_url, meta.child_id) == (0, [(1, len(varied()) + 1)])
        # A whole turn in one batch, no open rows before it: one segment, nothing deleted.
        before = len(traced.writes)
        whole = store.append(meta.child_id, [*varied(2), turn_end(2)])
        if store_url == sqlite_url:
            assert traced.writes[before:] == []
        assert store.load(meta.child_id).events[-len(whole) :] == whole
        assert stored_rows(store_url, meta.child_id)[1][-1] == (whole[0].seq, whole[-1].seq)
        assert store.append(meta.child_id, [message(9)])[0].seq == whole[-1].seq + 1


def test_a_long_turn_is_sealed_into_several_bounded_segments(
    store: SqlStore, store_url: str
) -> None:
    meta = new_child(store)
    many = [message(n) for n in range(SEGMENT_EVENTS + 10)]
    large = NewEvent(kind="k", turn=1, data={"text": "x" * (SEGMENT_CHARS // 2 + 1)})
    store.append(meta.child_id, many)
    store.append(meta.child_id, [large, large, large])
    before = store.load(meta.child_id).events

    store.append(meta.child_id, [turn_end()])

    assert store.load(meta.child_id).events[:-1] == before
    open_rows, segments = stored_rows(store_url, meta.child_id)
    assert open_rows == 0
    assert segments[0] == (1, SEGMENT_EVENTS)
    assert len(segments) == 4  # 512 events | 10 events + one large | one large | one + end
    assert [first for first, _ in segments[1:]] == [last + 1 for _, last in segments[:-1]]
    assert segments[-1][1] == len(before) + 1


def test_a_turn_end_retried_after_an_unacknowledged_commit_is_found_sealed_and_written_once(
    store_url: str, retries: RetryLog
) -> None:
    with SqlStore(store_url, retry=recording(retries)) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(1), message(2)])
        lost = LostAck(transient_error(store_url))
        store._after_commit = lost  # the documented test seam

        stored = store.append(meta.child_id, [message(3), turn_end()])

        store._after_commit = None
        assert (lost.fired, len(retries)) == (1, 1)
        assert [e.seq for e in stored] == [3, 4]
        assert [e.seq for e in store.load(meta.child_id).events] == [1, 2, 3, 4]
        assert store.load(meta.child_id).events[2:] == stored
        assert stored_rows(store_url, meta.child_id) == (0, [(1, 4)])


def test_a_create_retried_after_its_turn_was_sealed_still_finds_its_own_events(
    store: SqlStore, store_url: str
) -> None:
    # The retry's lookup (`_created_by`): open rows first, then the segments they went to.
    meta = ChildMeta(child_id=str(uuid.uuid4()), parent_session="p", depth=1)
    created = store.create_child(meta, varied())
    store.append(meta.child_id, [turn_end()])
    engine = raw_engine(store_url)
    with engine.connect() as conn:
        batch = conn.execute(
            sa.text("SELECT created_batch FROM subagent_children WHERE child_id = :c"),
            {"c": meta.child_id},
        ).scalar_one()
    engine.dispose()

    assert stored_rows(store_url, meta.child_id)[0] == 0
    assert store._appends.created_by(meta.child_id, batch) == created
    assert store._appends.created_by(meta.child_id, "0" * 32) is None


def test_an_older_stores_open_rows_are_sealed_at_its_next_turn_end(store_url: str) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
        first.append(meta.child_id, [*varied(1), turn_end(1)])
        first.append(meta.child_id, varied(2))
        before = first.load(meta.child_id).events
    as_version_1(store_url)  # every event an open row again, no segments table
    count = len(before)

    with SqlStore(store_url) as again:
        assert again.load(meta.child_id).events == before
        assert stored_rows(store_url, meta.child_id) == (count, [])
        (ended,) = again.append(meta.child_id, [turn_end(2)])
        assert again.load(meta.child_id).events == [*before, ended]
    assert stored_rows(store_url, meta.child_id) == (0, [(1, count + 1)])


@pytest.mark.timeout(120)
def test_concurrent_appends_that_end_turns_keep_every_event_once_in_order(
    store: SqlStore,
) -> None:
    threads, appends = 4, 60
    meta = new_child(store)
    start = threading.Barrier(threads)

    def writer(thread: int) -> list[list[int]]:
        start.wait(timeout=10)
        batches = []
        for n in range(appends):
            batch: list[NewEvent] = [
                NewEvent(kind="k", turn=1, data={"t": thread, "n": n, "i": i}) for i in range(2)
            ]
            if n % 7 == thread % 7:
                batch.append(turn_end())
            batches.append([e.seq for e in store.append(meta.child_id, batch)])
        return batches

    with ThreadPoolExecutor(threads) as pool:
        returned = [seqs for batches in pool.map(writer, range(threads)) for seqs in batches]

    events = store.load(meta.child_id).events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sorted(seq for seqs in returned for seq in seqs) == [e.seq for e in events]
    for seqs in returned:  # each batch contiguous
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    data: list[Any] = [e.data for e in events if e.kind == "k"]
    assert len({(d["t"], d["n"], d["i"]) for d in data}) == threads * appends * 2


@pytest.mark.parametrize("version", [3, 4, SCHEMA_VERSION])
def test_a_read_only_store_reads_sealed_turns(store_url: str, version: int) -> None:
    # Read as it is, an older store's segments are read too: every version since 3 has them
    # (a read-only store on version 3 or 4 once read none of its sealed events).
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store)
        store.append(meta.child_id, [*varied(), turn_end()])
        expected = store.load(meta.child_id)
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subagent_schema SET version = :v"), {"v": version})
    engine.dispose()
    with SqlStore(store_url, read_only=True) as looking:
        assert looking.load(meta.child_id) == expected


# -- sealing itself, without a database: any stored text reads back the same ----------------


class Rows:
    """A cursor over given rows, as `decode_events` reads one."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchmany(self, size: int = 64, /) -> list[tuple[Any, ...]]:
        chunk, self._rows = self._rows[:size], self._rows[size:]
        return chunk


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(json_values, st.sampled_from(["k", "user/message", 'odd "✓"']), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
@pytest.mark.slow  # measured: 13 s under load (--durations)
def test_sealed_text_decodes_to_the_same_events_as_the_open_rows(
    items: list[tuple[object, str, bool]],
) -> None:
    stamp = "2026-11-30T21:00:00.000001+00:00"
    source = MessageSource(kind="human", sender_session_id="p").model_dump_json()
    rows = [
        (seq, 1, kind, to_json(data), source if sourced else None, stamp, f"b{seq // 3}")
        for seq, (data, kind, sourced) in enumerate(items, start=1)
    ]
    open_events = decode_events(Rows([row[:6] for row in rows]))

    sealed = [event for segment in seal(rows) for event in decode_segment(segment.events)]

    assert sealed == open_events
    assert [e.data for e in sealed] == [data for data, _, _ in items]
