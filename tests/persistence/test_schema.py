"""The schema: versioned, refused when newer, indexed so one load stays one lookup."""

from __future__ import annotations

import json
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import ChildMeta, ErrorCode, SubagentControlError
from persistence import RetryPolicy, SqlStore
from persistence._children_sql import ChildStatements
from persistence._dialect import PostgresSql, SqliteSql
from persistence._schema import SCHEMA_VERSION
from tests.persistence.conftest import as_version_1, message, new_child, raw_engine

MANY = 100_000


def schema_version(url: str) -> list[tuple[int, int]]:
    engine = raw_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, version FROM subagent_schema")).all()
    engine.dispose()
    return [(row[0], row[1]) for row in rows]


def test_a_new_store_records_its_schema_version(store: SqlStore, store_url: str) -> None:
    assert schema_version(store_url) == [(1, SCHEMA_VERSION)]


def test_reopening_a_store_keeps_its_version_and_its_data(store_url: str) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
    with SqlStore(store_url) as again:
        assert again.list_children() == [meta]
    assert schema_version(store_url) == [(1, SCHEMA_VERSION)]


def test_a_store_written_by_a_newer_version_is_refused_with_a_clear_error(
    store_url: str,
) -> None:
    with SqlStore(store_url) as first:
        new_child(first)
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subagent_schema SET version = 99"))
    engine.dispose()

    with pytest.raises(SubagentControlError) as raised:
        SqlStore(store_url)

    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "99" in raised.value.message
    assert "upgrade subagent-control" in raised.value.message


def test_a_version_1_store_is_migrated_and_its_children_resume_gapless(store_url: str) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
        first.append(meta.child_id, [message(1), message(2)])
        before = first.load(meta.child_id)
    as_version_1(store_url)

    with SqlStore(store_url) as again:
        assert again.load(meta.child_id) == before
        stored = again.append(meta.child_id, [message(3)])
        assert [e.seq for e in stored] == [3]
        assert [e.seq for e in again.load(meta.child_id).events] == [1, 2, 3]
    assert schema_version(store_url) == [(1, SCHEMA_VERSION)]
    engine = raw_engine(store_url)
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("subagent_children")}
    engine.dispose()
    assert "last_seq" not in columns


def test_a_read_only_open_reads_an_older_store_as_it_is_and_migrates_nothing(
    store_url: str,
) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
        first.append(meta.child_id, [message(1), message(2)])
        before = first.load(meta.child_id)
    as_version_1(store_url)

    with SqlStore(store_url, read_only=True) as looking:
        assert looking.load(meta.child_id) == before
        assert looking.list_children() == [before.meta]
    assert schema_version(store_url) == [(1, 1)]


def test_a_read_only_store_refuses_every_write_and_writes_nothing(store_url: str) -> None:
    with SqlStore(store_url) as first:
        meta = new_child(first)
    with SqlStore(store_url, read_only=True) as looking:
        for write in (
            lambda: looking.append(meta.child_id, [message(1)]),
            lambda: looking.create_child(
                ChildMeta(child_id=str(uuid.uuid4()), parent_session="p", depth=1)
            ),
        ):
            with pytest.raises(SubagentControlError) as raised:
                write()
            assert raised.value.code == ErrorCode.INVALID_INPUT
            assert "read-only" in raised.value.message
        assert looking.load(meta.child_id).events == []
        assert looking.list_children() == [meta]


def test_a_read_only_open_of_a_database_without_a_store_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).close()  # an empty database: some other program's file
    with pytest.raises(SubagentControlError) as raised:
        SqlStore(f"sqlite:///{path}", read_only=True, retry=RetryPolicy.immediate())
    assert raised.value.code == ErrorCode.STORE_NOT_FOUND  # a wrong URL, not an outage
    assert "no subagent-control store" in raised.value.message
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


# -- one load among many children is an index lookup ------------------------------------


def _bulk_children_sqlite(path: str, count: int) -> str:
    """``count`` children with two events each, written in one transaction; a child id."""
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    data = json.dumps({"text": "x"})
    ids = [str(uuid.uuid4()) for _ in range(count)]
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO subagent_children (child_id, parent_session, depth, seed_length, "
            "label, created_batch, created_at) VALUES (?, 'p', 1, 0, NULL, 'b', ?)",
            ((child_id, now) for child_id in ids),
        )
        conn.executemany(
            "INSERT INTO subagent_events (child_id, seq, turn, kind, data, source, batch_id, "
            "created_at) VALUES (?, ?, 1, 'k', ?, NULL, 'b', ?)",
            ((child_id, seq, data, now) for child_id in ids for seq in (1, 2)),
        )
        conn.execute("ANALYZE")
    return ids[count // 2]


@pytest.mark.slow
def test_loading_one_child_among_100000_is_an_index_lookup_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    url = f"sqlite:///{path}"
    with SqlStore(url) as store:
        some_child = _bulk_children_sqlite(str(path), MANY)
        mine = new_child(store)
        store.append(mine.child_id, [message(1), message(2), message(3)])

        assert [e.seq for e in store.load(mine.child_id).events] == [1, 2, 3]
        assert len(store.load(some_child).events) == 2

    sql = ChildStatements.build(SqliteSql())
    with sqlite3.connect(path) as conn:
        for statement in (sql.header, sql.events, sql.load, sql.last_seq):
            binds = ("x",) * statement.count("?")
            plan = " | ".join(
                row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", binds)
            )
            assert "SEARCH" in plan, plan
            assert "SCAN" not in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # ORDER BY seq comes from the index
        plan = " | ".join(
            row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql.landed}", ("x", "b"))
        )
        assert "SEARCH" in plan, plan
        assert "child_id=?" in plan, plan


@pytest.mark.postgres
@pytest.mark.slow
def test_loading_one_child_among_100000_is_an_index_lookup_on_postgresql(pg_url: str) -> None:
    import psycopg

    with SqlStore(pg_url) as store:
        mine = new_child(store)
        store.append(mine.child_id, [message(1), message(2), message(3)])
        engine = raw_engine(pg_url)
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO subagent_children (child_id, parent_session, depth, seed_length,"
                    " created_batch, created_at) "
                    "SELECT 'bulk-' || n, 'p', 1, 0, 'b', now() "
                    "FROM generate_series(1, :count) AS n"
                ),
                {"count": MANY},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO subagent_events (child_id, seq, turn, kind, data, batch_id,"
                    " created_at) SELECT 'bulk-' || n, s, 1, 'k', '{}', 'b', now() "
                    "FROM generate_series(1, :count) AS n, generate_series(1, 2) AS s"
                ),
                {"count": MANY},
            )
            conn.execute(sa.text("ANALYZE subagent_children"))
            conn.execute(sa.text("ANALYZE subagent_events"))
        engine.dispose()

        assert [e.seq for e in store.load(mine.child_id).events] == [1, 2, 3]
        assert len(store.load(f"bulk-{MANY // 2}").events) == 2

    sql = ChildStatements.build(PostgresSql())
    libpq = sa.make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq) as conn:
        for statement in (sql.header, sql.events, sql.load, sql.last_seq):
            binds = ("bulk-7",) * statement.count("%s")
            plan = " | ".join(row[0] for row in conn.execute(f"EXPLAIN {statement}", binds))
            assert "Index" in plan, plan
            assert "Seq Scan" not in plan, plan


# -- sqlalchemy.exc never escapes ------------------------------------------------------------


def test_a_file_that_is_not_a_database_is_unavailable_not_a_sqlalchemy_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database file, just some bytes " * 100)
    with pytest.raises(SubagentControlError) as raised:
        SqlStore(f"sqlite:///{path}", retry=RetryPolicy.immediate())
    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "not a database" in raised.value.message


def test_a_database_in_a_missing_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SubagentControlError) as raised:
        SqlStore(f"sqlite:///{tmp_path}/no/such/dir/state.db", retry=RetryPolicy.immediate())
    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "unable to open database file" in raised.value.message


def test_missing_tables_surface_as_store_unavailable_on_every_operation(
    store_url: str,
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        meta = new_child(store)
        engine = raw_engine(store_url)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE subagent_segments"))
            conn.execute(sa.text("DROP TABLE subagent_events"))
            conn.execute(sa.text("DROP TABLE subagent_children"))
        engine.dispose()
        for call, args in (
            (store.append, (meta.child_id, [message(1)])),
            (store.append, (meta.child_id, [])),
            (store.load, (meta.child_id,)),
            (store.list_children, ()),
            (store.create_child, (meta,)),
        ):
            with pytest.raises(SubagentControlError) as raised:
                call(*args)  # type: ignore[operator]
            assert raised.value.code == ErrorCode.STORE_UNAVAILABLE, call
            assert isinstance(raised.value.__cause__, Exception)
            assert "SELECT" not in raised.value.message  # no SQL text in the message


def test_every_public_operation_on_a_closed_store_says_closed(store: SqlStore) -> None:
    meta = new_child(store)
    store.close()
    for call, args in (
        (store.append, (meta.child_id, [message(1)])),
        (store.load, (meta.child_id,)),
        (store.list_children, ()),
        (store.create_child, (meta,)),
    ):
        with pytest.raises(SubagentControlError) as raised:
            call(*args)  # type: ignore[operator]
        assert raised.value.code == ErrorCode.CLOSED
