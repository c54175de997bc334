"""A writable store opens its first read's connection when it opens, not on that read's path
(issue 18: a cold resume's load paid 0.6-0.9 ms for it on SQLite).

A running control plane holds one connection for good by its first send: SQLite's first
write keeps its own (the kept writer), PostgreSQL's inbox listener keeps one. The pool must
still hold one for the read that follows.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, event

from controlplane import ErrorCode, SubagentControlError
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import message, new_child, raw_engine


@contextmanager
def connects_counted() -> Iterator[list[object]]:
    """The DBAPI connections every engine made while the block ran (the store's engine is
    made inside its constructor, so the listener is on all of them)."""
    made: list[object] = []

    def count(dbapi_connection: object, _record: Any) -> None:
        made.append(dbapi_connection)

    event.listen(Engine, "connect", count)
    try:
        yield made
    finally:
        event.remove(Engine, "connect", count)


def test_the_first_read_after_a_write_opens_no_connection(store_url: str) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store, connects_counted() as made:
        # As a control plane's inbox listener does on PostgreSQL (SQLite's first write
        # keeps a connection of its own instead).
        listener = None if store_url.startswith("sqlite") else store._db.engine.raw_connection()
        try:
            meta = new_child(store)
            store.append(meta.child_id, [message(1)])
            assert [e.seq for e in store.load(meta.child_id).events] == [1]
        finally:
            if listener is not None:
                listener.close()
        assert made == []


def test_a_writable_store_opens_two_connections_and_a_read_only_store_one(sqlite_url: str) -> None:
    with connects_counted() as made:
        SqlStore(sqlite_url).close()
    assert len(made) == 2
    with connects_counted() as made, SqlStore(sqlite_url, read_only=True) as store:
        assert store.list_children() == []
    # Read-only: no write ever takes the connection its check used, so reads reuse it.
    assert len(made) == 1


def test_closing_the_store_closes_the_connection_opened_for_reads(sqlite_url: str) -> None:
    with connects_counted() as made:
        store = SqlStore(sqlite_url)
    store.close()
    assert len(made) == 2
    for connection in made:
        assert isinstance(connection, sqlite3.Connection)
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            connection.execute("SELECT 1")


def test_a_read_connection_that_cannot_open_fails_the_open_like_any_connection(
    sqlite_url: str,
) -> None:
    made: list[object] = []

    def refuse_all_but_the_first(dbapi_connection: object, _record: Any) -> None:
        made.append(dbapi_connection)
        if len(made) > 1:
            raise sqlite3.OperationalError("unable to open database file")

    event.listen(Engine, "connect", refuse_all_but_the_first)
    try:
        with pytest.raises(SubagentControlError) as raised:
            SqlStore(sqlite_url, retry=RetryPolicy.immediate(max_attempts=2))
    finally:
        event.remove(Engine, "connect", refuse_all_but_the_first)
    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert raised.value.message.startswith("could not open the store: ")
    assert "unable to open database file" in raised.value.message
    with SqlStore(sqlite_url) as store:  # nothing was left half-open
        assert store.list_children() == []


def test_an_in_memory_store_keeps_its_one_connection() -> None:
    with connects_counted() as made, SqlStore("sqlite://") as store:
        meta = new_child(store)
        assert store.load(meta.child_id).meta == meta
    assert len(made) == 1


def test_a_load_reads_the_header_and_the_transcript_in_one_statement(sqlite_url: str) -> None:
    # One statement, so one round trip and one snapshot (a cold resume paid a statement more).
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store, label="one statement")
        store.append(meta.child_id, [message(1), message(2)])
        store.append(meta.child_id, [message(3, kind="turn/end")])  # sealed: a segment row
        store.append(meta.child_id, [message(4, turn=2)])  # and an open row after it
        traced: list[str] = []

        def trace(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            assert isinstance(dbapi_connection, sqlite3.Connection)
            dbapi_connection.set_trace_callback(traced.append)

        event.listen(store._db.engine, "checkout", trace)
        loaded = store.load(meta.child_id)

    assert len(traced) == 1, traced
    assert loaded.meta == meta
    assert [(e.seq, e.data["n"]) for e in loaded.events] == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_a_load_of_a_missing_child_is_child_not_found(store_url: str) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        new_child(store)  # another child exists
        with pytest.raises(SubagentControlError) as raised:
            store.load("no-such-child")
    assert raised.value.code == ErrorCode.CHILD_NOT_FOUND


def test_a_read_only_store_written_before_segments_loads_in_one_statement_too(
    store_url: str,
) -> None:
    # A version-2 store has no segments table: its load statement reads open rows only.
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store, seed_length=0)
        store.append(meta.child_id, [message(1), message(2)])
        expected = store.load(meta.child_id)
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subagent_schema SET version = 2"))
    engine.dispose()
    with SqlStore(store_url, read_only=True) as looking:
        assert looking._db.sql.children.load.count("subagent_segments") == 0
        assert looking.load(meta.child_id) == expected


@contextmanager
def checkouts_counted(store: SqlStore) -> Iterator[list[object]]:
    """Every connection the store's pool hands out while the block runs."""
    taken: list[object] = []

    def count(dbapi_connection: object, _record: Any, _proxy: Any) -> None:
        taken.append(dbapi_connection)

    pool = store._db.engine.pool
    event.listen(pool, "checkout", count)
    try:
        yield taken
    finally:
        event.remove(pool, "checkout", count)


def test_sqlite_reads_reuse_the_connection_the_last_read_left_not_the_pools(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(1)])
        store.load(meta.child_id)
        with checkouts_counted(store) as taken:
            for n in range(2, 12):
                store.append(meta.child_id, [message(n)])
                assert len(store.load(meta.child_id).events) == n
        assert taken == []  # no checkout, no reset on return: a kept reader each time


def test_a_kept_reader_sees_what_another_connection_committed_after_its_last_read(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url) as mine, SqlStore(sqlite_url) as theirs:
        meta = new_child(mine)
        mine.append(meta.child_id, [message(1), message(2)])
        with mine._db.cursor(write=False) as cursor:
            # A read left unfinished (one row of two): closed before its connection is
            # kept, its statement holds no snapshot for the next read.
            cursor.execute("SELECT seq FROM subagent_events ORDER BY seq")
            assert cursor.fetchone() == (1,)
        theirs.append(meta.child_id, [message(3)])
        assert [e.seq for e in mine.load(meta.child_id).events] == [1, 2, 3]


def test_a_read_that_fails_in_the_database_gives_up_its_connection(sqlite_url: str) -> None:
    with SqlStore(sqlite_url) as store:
        meta = new_child(store)
        store.load(meta.child_id)  # a reader is kept now
        failing = store._db.cursor(write=False)
        with pytest.raises(sqlite3.OperationalError), failing as cursor:
            cursor.execute("SELECT nothing FROM no_such_table")
        with checkouts_counted(store) as taken:
            store.load(meta.child_id)
        assert len(taken) == 1  # the failed read's connection was not kept: a new checkout


def test_a_forked_child_reads_without_the_parents_kept_readers_and_leaves_them_working(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(1)])
        assert len(store.load(meta.child_id).events) == 1  # a reader is kept now
        child = multiprocessing.get_context("fork").Process(
            target=_load_in_child, args=(store, meta.child_id)
        )
        child.start()
        child.join(timeout=30)
        assert child.exitcode == 0
        store.append(meta.child_id, [message(2)])
        assert len(store.load(meta.child_id).events) == 2


def _load_in_child(store: SqlStore, child_id: str) -> None:
    assert store._db._readers == []  # the parent's connections are not this process's
    found = store.load(child_id)
    store.close()  # leaves the parent's kept readers alone
    raise SystemExit(0 if len(found.events) == 1 else 1)


def test_a_short_read_runs_on_the_writers_connection_when_no_write_holds_it(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(1)])
        writer = store._db._writer
        assert writer is not None
        with store._db.cursor(write=False, short=True) as cursor:
            assert cursor.connection is writer.dbapi_connection
        # A write holds the lock (here, this test): the short read does not wait for it.
        with store._db._lock, store._db.cursor(write=False, short=True) as cursor:
            assert cursor.connection is not writer.dbapi_connection
            cursor.execute("SELECT count(*) FROM subagent_events")
            assert cursor.fetchone() == (1,)


def test_a_short_read_left_unfinished_holds_no_snapshot_into_the_next_write(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url) as mine, SqlStore(sqlite_url) as theirs:
        meta = new_child(mine)
        mine.append(meta.child_id, [message(1), message(2)])
        with mine._db.cursor(write=False, short=True) as cursor:
            cursor.execute("SELECT seq FROM subagent_events ORDER BY seq")
            assert cursor.fetchone() == (1,)  # one row of two: its statement still open
        theirs.append(meta.child_id, [message(3)])
        # The writer's next transaction sees that commit: seq 4, not a second seq 3.
        assert mine.append(meta.child_id, [message(4)])[0].seq == 4
        assert [e.seq for e in mine.load(meta.child_id).events] == [1, 2, 3, 4]
