"""Bad input gets a SubagentControlError with a stable code, and nothing is written."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from controlplane import (
    ChildMeta,
    ErrorCode,
    LoadedSession,
    MessageSource,
    NewEvent,
    SubagentControlError,
)
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import message, new_child, raw_engine


class Unserialisable:
    pass


BAD_DATA = [
    pytest.param(float("nan"), id="nan"),
    pytest.param({"x": float("inf")}, id="infinity"),
    pytest.param({1, 2}, id="set"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(Unserialisable(), id="object"),
    pytest.param({1: "non-string key"}, id="int-key"),
    pytest.param({"deep": [{"ok": 1}, {"bad": {3.5}}]}, id="nested-set"),
    pytest.param("lone surrogate \ud800", id="surrogate"),
]

BAD_EVENTS = [
    pytest.param({"kind": 7, "turn": 1, "data": None}, id="kind-not-str"),
    pytest.param({"kind": "", "turn": 1, "data": None}, id="kind-empty"),
    pytest.param({"kind": "nul\x00kind", "turn": 1, "data": None}, id="kind-nul"),
    pytest.param({"kind": "k", "turn": "1", "data": None}, id="turn-str"),
    pytest.param({"kind": "k", "turn": True, "data": None}, id="turn-bool"),
    pytest.param({"kind": "k", "turn": 1.0, "data": None}, id="turn-float"),
    pytest.param({"kind": "k", "turn": -1, "data": None}, id="turn-negative"),
    pytest.param({"kind": "k", "turn": 2**31, "data": None}, id="turn-too-big"),
    pytest.param({"kind": "k", "turn": 1}, id="data-missing"),
    pytest.param({"kind": "k", "turn": 1, "data": None, "extra": 1}, id="unknown-key"),
    pytest.param({"kind": "k", "turn": 1, "data": None, "source": "user"}, id="source-str"),
    pytest.param({"kind": "k", "turn": 1, "data": None, "source": {"kind": ""}}, id="source-bad"),
    pytest.param(("k", 1, None), id="tuple-event"),
    pytest.param(None, id="none-event"),
]

BAD_BATCHES = [
    pytest.param(None, id="none"),
    pytest.param("turn/start", id="string"),
    pytest.param({"kind": "k", "turn": 1, "data": None}, id="one-mapping"),
    pytest.param(NewEvent(kind="k", turn=1, data=None), id="one-event"),
    pytest.param(42, id="int"),
]


@pytest.fixture
def child(store: SqlStore) -> Iterator[tuple[SqlStore, ChildMeta, LoadedSession]]:
    """A child with two events, and its state to compare against after a refused call."""
    meta = new_child(store)
    store.append(meta.child_id, [message(1), message(2)])
    before = store.load(meta.child_id)
    yield store, meta, before
    # Whatever the test did, nothing was half-written: same transcript, same children.
    assert store.load(meta.child_id) == before
    assert store.append(meta.child_id, [message(3)])[0].seq == 3


def refused(code: ErrorCode, call: Any, *args: Any, **kwargs: Any) -> SubagentControlError:
    with pytest.raises(SubagentControlError) as raised:
        call(*args, **kwargs)
    assert raised.value.code == code, raised.value
    return raised.value


@pytest.mark.parametrize("data", BAD_DATA)
def test_non_json_event_data_is_refused_and_nothing_is_written(
    child: tuple[SqlStore, ChildMeta, LoadedSession], data: object
) -> None:
    store, meta, _ = child
    as_event = NewEvent(kind="k", turn=1, data=data)
    error = refused(ErrorCode.INVALID_INPUT, store.append, meta.child_id, [message(9), as_event])
    assert "event 1" in error.message
    refused(
        ErrorCode.INVALID_INPUT,
        store.append,
        meta.child_id,
        [{"kind": "k", "turn": 1, "data": data}],
    )


@pytest.mark.parametrize("event", BAD_EVENTS)
def test_an_event_with_a_bad_key_or_type_is_refused_with_its_whole_batch(
    child: tuple[SqlStore, ChildMeta, LoadedSession], event: object
) -> None:
    store, meta, _ = child
    error = refused(ErrorCode.INVALID_INPUT, store.append, meta.child_id, [message(9), event])
    assert "event 1" in error.message


@pytest.mark.parametrize("events", BAD_BATCHES)
def test_a_batch_that_is_not_a_list_of_events_is_refused(
    child: tuple[SqlStore, ChildMeta, LoadedSession], events: object
) -> None:
    store, meta, _ = child
    refused(ErrorCode.INVALID_INPUT, store.append, meta.child_id, events)


def test_a_batch_failing_inside_the_database_writes_nothing(
    child: tuple[SqlStore, ChildMeta, LoadedSession], store_url: str
) -> None:
    store, meta, _ = child
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(
                sa.text(
                    "CREATE TRIGGER explode BEFORE INSERT ON subagent_events "
                    "WHEN NEW.kind = 'explode' BEGIN SELECT RAISE(ABORT, 'boom'); END"
                )
            )
        else:
            conn.execute(
                sa.text(
                    "CREATE FUNCTION explode() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    "BEGIN IF NEW.kind = 'explode' THEN RAISE EXCEPTION 'boom'; END IF; "
                    "RETURN NEW; END $$"
                )
            )
            conn.execute(
                sa.text(
                    "CREATE TRIGGER explode BEFORE INSERT ON subagent_events "
                    "FOR EACH ROW EXECUTE FUNCTION explode()"
                )
            )
    try:
        error = refused(
            ErrorCode.STORE_UNAVAILABLE,
            store.append,
            meta.child_id,
            [message(9), NewEvent(kind="explode", turn=1, data=None), message(10)],
        )
        assert "boom" in error.message
    finally:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "DROP TRIGGER explode ON subagent_events"
                    if engine.dialect.name == "postgresql"
                    else "DROP TRIGGER explode"
                )
            )
        engine.dispose()


def test_an_unknown_child_is_not_found_on_append_and_load(store: SqlStore) -> None:
    missing = str(uuid.uuid4())
    for call, args in (
        (store.append, (missing, [message(1)])),
        (store.append, (missing, [])),
        (store.load, (missing,)),
    ):
        error = refused(ErrorCode.CHILD_NOT_FOUND, call, *args)
        assert error.child_id == missing
    assert store.list_children() == []


@pytest.mark.parametrize("child_id", [None, "", 7, b"id", "nul\x00id"])
def test_a_child_id_that_is_not_a_non_empty_string_is_invalid(
    store: SqlStore, child_id: object
) -> None:
    refused(ErrorCode.INVALID_INPUT, store.append, child_id, [message(1)])
    refused(ErrorCode.INVALID_INPUT, store.load, child_id)


def test_a_duplicate_child_id_is_refused_and_the_first_header_and_events_are_kept(
    store: SqlStore,
) -> None:
    meta = ChildMeta(child_id=str(uuid.uuid4()), parent_session="p", depth=1, label="first")
    store.create_child(meta, [message(1)])
    second = ChildMeta(child_id=meta.child_id, parent_session="q", depth=3, label="second")

    error = refused(ErrorCode.CHILD_EXISTS, store.create_child, second, [message(2)])

    assert error.child_id == meta.child_id
    loaded = store.load(meta.child_id)
    assert loaded.meta == meta
    assert [e.data["n"] for e in loaded.events] == [1]
    assert store.list_children() == [meta]
    refused(ErrorCode.CHILD_EXISTS, store.create_child, meta)


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("not a header", id="string"),
        pytest.param({"child_id": "c", "parent_session": "p", "depth": 0}, id="depth-0"),
        pytest.param(
            {
                "child_id": "c",
                "parent_session": "p",
                "depth": 1,
                "created_at": datetime(2024, 1, 1),
            },
            id="naive-time",
        ),
        pytest.param(ChildMeta(child_id="c", parent_session="p\x00", depth=1), id="nul-in-parent"),
        pytest.param(
            ChildMeta(child_id="c", parent_session="p", depth=1, seed_length=2), id="seed"
        ),
    ],
)
def test_a_bad_child_header_is_refused_and_creates_nothing(store: SqlStore, header: object) -> None:
    refused(ErrorCode.INVALID_INPUT, store.create_child, header, [message(1)])
    assert store.list_children() == []


def test_create_child_refuses_a_batch_with_one_bad_event_and_creates_nothing(
    store: SqlStore,
) -> None:
    meta = ChildMeta(child_id="c", parent_session="p", depth=1)
    bad = NewEvent(kind="k", turn=1, data={"s": {1}})
    refused(ErrorCode.INVALID_INPUT, store.create_child, meta, [message(1), bad])
    assert store.list_children() == []
    refused(ErrorCode.CHILD_NOT_FOUND, store.load, "c")


def test_a_header_given_as_a_mapping_is_accepted(store: SqlStore) -> None:
    store.create_child({"child_id": "c", "parent_session": "p", "depth": 2})  # type: ignore[arg-type]
    assert store.load("c").meta.depth == 2


def test_list_children_refuses_a_parent_that_is_not_a_string(store: SqlStore) -> None:
    refused(ErrorCode.INVALID_INPUT, store.list_children, 5)


def test_a_source_given_as_a_model_or_mapping_is_kept(store: SqlStore) -> None:
    meta = new_child(store)
    stored = store.append(
        meta.child_id,
        [
            {"kind": "k", "turn": 1, "data": 1, "source": MessageSource(kind="human")},
            {"kind": "k", "turn": 1, "data": 2, "source": {"kind": "coordinator"}},
        ],
    )
    assert [e.source for e in store.load(meta.child_id).events] == [e.source for e in stored]


# -- URLs and drivers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(None, id="none"),
        pytest.param(b"sqlite://", id="bytes"),
        pytest.param("not a url", id="unparsable"),
        pytest.param("", id="empty"),
        pytest.param("mysql://u@h/db", id="mysql"),
        pytest.param("nosuchdb://x", id="unknown-scheme"),
        pytest.param("postgresql+psycopg2://u@h/db", id="other-pg-driver"),
        pytest.param("sqlite+pysqlcipher:///x.db", id="other-sqlite-driver"),
        pytest.param("sqlite:///x.db?timeout=soon", id="bad-query-value"),
        pytest.param("postgresql+psycopg://u@h:port/db", id="bad-port"),
    ],
)
def test_a_url_the_store_cannot_use_is_invalid_input(url: object) -> None:
    error = refused(ErrorCode.INVALID_INPUT, SqlStore, url)
    assert "URL" in error.message


def test_a_missing_postgresql_driver_is_reported_as_unavailable_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if it were not installed
    error = refused(ErrorCode.STORE_UNAVAILABLE, SqlStore, "postgresql+psycopg://u@h/db")
    assert "subagent-control[postgres]" in error.message


def test_a_retry_policy_of_the_wrong_type_is_invalid(tmp_path: Any) -> None:
    refused(ErrorCode.INVALID_INPUT, SqlStore, f"sqlite:///{tmp_path}/x.db", retry=3)
    assert RetryPolicy.immediate(max_attempts=2).max_attempts == 2
