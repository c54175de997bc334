"""What goes into the store comes back out, the same, in order, on both backends."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from controlplane import (
    ChildMeta,
    ErrorCode,
    EventKind,
    LoadedSession,
    MessageSource,
    NewEvent,
    SessionEvent,
    SubagentControlError,
)
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import message, new_child


def test_a_child_created_with_its_first_events_loads_back_with_the_same_header_and_events(
    store: SqlStore,
) -> None:
    created_at = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    meta = ChildMeta(
        child_id=str(uuid.uuid4()),
        parent_session="parent-1",
        depth=2,
        seed_length=1,
        created_at=created_at,
        label="research X",
    )
    seed = NewEvent(kind=EventKind.USER_MESSAGE, turn=0, data={"text": "from the parent"})
    frame = [
        NewEvent(kind=EventKind.TURN_START, turn=1, data={}),
        NewEvent(
            kind=EventKind.USER_MESSAGE,
            turn=1,
            data={"text": "go"},
            source=MessageSource(kind="user"),
        ),
        NewEvent(kind=EventKind.DESCRIPTOR, turn=1, data={"version": 1, "provider": "p"}),
    ]

    stored = store.create_child(meta, [seed, *frame])
    loaded = store.load(meta.child_id)

    assert loaded.meta == meta
    assert loaded.events == stored
    assert [e.seq for e in stored] == [1, 2, 3, 4]
    assert [(e.kind, e.turn, e.data, e.source) for e in stored] == [
        (e.kind, e.turn, e.data, e.source) for e in [seed, *frame]
    ]
    assert loaded.seed == stored[:1]
    assert loaded.own_events == stored[1:]


def test_appended_events_get_consecutive_seqs_and_load_back_equal_to_what_append_returned(
    store: SqlStore,
) -> None:
    meta = new_child(store)
    first = store.append(meta.child_id, [message(1)])
    batch = store.append(meta.child_id, [message(2), message(3, turn=2)])
    as_mappings = store.append(
        meta.child_id,
        [
            {
                "kind": "steering/message",
                "turn": 2,
                "data": {"text": "hi"},
                "source": {"kind": "human", "sender_session_id": "s-9"},
            },
            {"kind": "turn/end", "turn": 2, "data": None},
        ],
    )

    loaded = store.load(meta.child_id)

    assert [e.seq for e in loaded.events] == [1, 2, 3, 4, 5]
    assert loaded.events == [*first, *batch, *as_mappings]
    assert loaded.events[3].source == MessageSource(kind="human", sender_session_id="s-9")
    assert loaded.events[4].data is None
    assert loaded.last_turn == 2


def test_json_values_survive_the_round_trip_exactly(store: SqlStore) -> None:
    data = {
        "unicode": "héllo — 世界 🚀",
        "float": 0.1 + 0.2,
        "big": 2**70,
        "negative": -5,
        "nested": [[], {}, [1, [2, [3]]], {"a": {"b": None}}],
        "bools": [True, False],
        "escapes": 'quote " backslash \\ newline \n nul \x00',
        "sql": "'); DROP TABLE subagent_events; --",
        "tuple": (1, 2),
    }
    meta = new_child(store)
    store.append(meta.child_id, [NewEvent(kind="k", turn=1, data=data)])

    (event,) = store.load(meta.child_id).events

    assert event.data == {**data, "tuple": [1, 2]}
    assert isinstance(event.data["big"], int)
    assert event.data["float"] == 0.30000000000000004


def test_appended_data_is_a_detached_copy_of_the_callers_value(store: SqlStore) -> None:
    meta = new_child(store)
    data = {"items": [1, 2]}
    (stored,) = store.append(meta.child_id, [NewEvent(kind="k", turn=1, data=data)])
    data["items"].append(3)

    assert stored.data == {"items": [1, 2]}
    assert store.load(meta.child_id).events[0].data == {"items": [1, 2]}


def test_timestamps_come_back_timezone_aware_in_utc(store: SqlStore) -> None:
    elsewhere = timezone(timedelta(hours=-7))
    created_at = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=elsewhere)
    meta = new_child(store, created_at=created_at)
    before = datetime.now(UTC)
    store.append(meta.child_id, [message(1)])

    loaded = store.load(meta.child_id)

    assert loaded.meta.created_at == created_at
    assert loaded.meta.created_at.utcoffset() == timedelta(0)
    (event,) = loaded.events
    assert event.created_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=5) <= event.created_at <= datetime.now(UTC)


def test_loaded_events_behave_like_validated_models(store: SqlStore) -> None:
    meta = new_child(store)
    store.append(
        meta.child_id,
        [NewEvent(kind="k", turn=1, data={"a": 1}, source=MessageSource(kind="user"))],
    )
    (event,) = store.load(meta.child_id).events

    validated = SessionEvent.model_validate(event.model_dump())
    assert event == validated
    assert event.model_fields_set == validated.model_fields_set
    assert event.model_dump_json() == validated.model_dump_json()
    assert event.model_copy(update={"turn": 9}).turn == 9
    with pytest.raises(ValidationError):
        event.turn = 2  # type: ignore[misc]


def test_copying_one_loaded_event_leaves_its_siblings_untouched(store: SqlStore) -> None:
    meta = new_child(store)
    store.append(meta.child_id, [message(1), message(2)])
    first, second = store.load(meta.child_id).events

    copied = first.model_copy(update={"turn": 7})
    deep = second.model_copy(deep=True)

    assert (copied.turn, first.turn, second.turn) == (7, 1, 1)
    assert first.model_fields_set == second.model_fields_set == set(SessionEvent.model_fields)
    assert deep == second
    assert deep.data is not second.data


def test_a_loaded_header_and_session_behave_like_validated_models(store: SqlStore) -> None:
    meta = new_child(store, label="x")
    loaded = store.load(meta.child_id)

    assert loaded.meta == meta
    assert (
        loaded.meta.model_fields_set == ChildMeta.model_validate(meta.model_dump()).model_fields_set
    )
    assert LoadedSession.model_validate(loaded.model_dump()) == loaded
    assert loaded.model_dump_json() == LoadedSession(meta=meta, events=[]).model_dump_json()
    with pytest.raises(ValidationError):
        loaded.meta.depth = 5  # type: ignore[misc]


def test_list_children_filters_by_parent_and_orders_oldest_first(store: SqlStore) -> None:
    base = datetime(2024, 1, 1, tzinfo=UTC)
    newest = new_child(store, parent="p-a", created_at=base + timedelta(seconds=2))
    oldest = new_child(store, parent="p-a", created_at=base)
    other = new_child(store, parent="p-b", created_at=base + timedelta(seconds=1))

    assert store.list_children("p-a") == [oldest, newest]
    assert store.list_children("p-b") == [other]
    assert store.list_children("nobody") == []
    assert store.list_children() == [oldest, other, newest]


def test_a_child_without_events_loads_with_an_empty_transcript(store: SqlStore) -> None:
    meta = new_child(store, label=None)
    loaded = store.load(meta.child_id)
    assert loaded.meta == meta
    assert loaded.events == []
    assert store.append(meta.child_id, []) == []


def test_data_written_by_one_store_is_read_by_another_opened_later(store_url: str) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
        written = first.append(meta.child_id, [message(1), message(2)])
    with SqlStore(store_url) as second:
        assert second.load(meta.child_id).events == written
        assert second.append(meta.child_id, [message(3)])[0].seq == 3


def test_stores_opening_a_new_database_at_the_same_time_all_work(store_url: str) -> None:
    start = threading.Barrier(4)

    def open_and_write(n: int) -> str:
        start.wait(timeout=10)
        with SqlStore(store_url, retry=RetryPolicy.immediate(max_attempts=50)) as opened:
            return new_child(opened, child_id=f"child-{n}").child_id

    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(open_and_write, range(4)))

    with SqlStore(store_url) as check:
        assert sorted(m.child_id for m in check.list_children()) == sorted(made)


def test_the_sqlite_file_uses_write_ahead_logging(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with SqlStore(f"sqlite:///{path}") as opened:
        new_child(opened)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_an_in_memory_store_is_one_database_shared_by_every_thread() -> None:
    with SqlStore("sqlite://", retry=RetryPolicy.immediate()) as memory:
        meta = new_child(memory)

        def write(n: int) -> None:
            for i in range(50):
                memory.append(meta.child_id, [message(n * 100 + i)])

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(write, range(4)))
        assert [e.seq for e in memory.load(meta.child_id).events] == list(range(1, 201))
    with SqlStore("sqlite:///:memory:") as other:
        assert other.list_children() == []


def test_the_store_is_a_context_manager_that_reports_its_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ctx.db"
    with SqlStore(url) as opened:
        assert opened.url == url
        assert url in repr(opened)
    with pytest.raises(SubagentControlError) as raised:
        opened.list_children()
    assert raised.value.code == ErrorCode.CLOSED
    opened.close()  # closing twice is harmless


@pytest.mark.postgres
def test_the_url_property_hides_the_password(pg_url: str) -> None:
    # The test server trusts local connections, so any password opens it.
    with_password = pg_url.replace("postgres@", "postgres:s3cret@", 1)
    with SqlStore(with_password) as opened:
        assert "s3cret" not in opened.url
        assert "s3cret" not in repr(opened)
        assert opened.url.startswith("postgresql+psycopg://postgres:***@")
