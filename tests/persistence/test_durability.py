"""``durable_os_crash=True`` makes every SQLite connection sync each commit to disk
(``synchronous=FULL``); the default (``NORMAL`` in WAL mode) survives a crash of the
process only. PostgreSQL's own durability is left as the server has it."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import ErrorCode, SubagentControlError
from persistence import SqlStore
from tests.persistence.conftest import message, new_child

_NORMAL, _FULL = 1, 2  # PRAGMA synchronous values


@pytest.mark.parametrize(("durable", "expected"), [(False, _NORMAL), (True, _FULL)])
def test_every_sqlite_connection_syncs_as_asked(
    sqlite_url: str, durable: bool, expected: int
) -> None:
    with SqlStore(sqlite_url, durable_os_crash=durable) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(1)])  # the kept writer connection exists now
        writer = store._db._writer
        assert writer is not None
        assert writer.cursor().execute("PRAGMA synchronous").fetchone() == (expected,)
        with store._db.engine.connect() as reader:
            assert reader.exec_driver_sql("PRAGMA synchronous").scalar() == expected
        assert [e.seq for e in store.load(meta.child_id).events] == [1]


def test_an_in_memory_store_accepts_the_option() -> None:
    with SqlStore("sqlite://", durable_os_crash=True) as store:
        meta = new_child(store)
        assert [e.seq for e in store.append(meta.child_id, [message(1)])] == [1]


@pytest.mark.postgres
def test_postgresql_durability_is_left_as_the_server_has_it(pg_url: str) -> None:
    with SqlStore(pg_url) as plain, SqlStore(pg_url, durable_os_crash=True) as durable:
        meta = new_child(durable)
        assert [e.seq for e in durable.append(meta.child_id, [message(1)])] == [1]
        settings = []
        for store in (plain, durable):
            with store._db.engine.connect() as conn:
                settings.append(conn.exec_driver_sql("SHOW synchronous_commit").scalar())
        assert settings[0] == settings[1]


@pytest.mark.parametrize("option", ["durable_os_crash", "pause_gc_on_load"])
@pytest.mark.parametrize("bad", [1, "FULL", None])
def test_the_store_s_switches_must_be_bools(sqlite_url: str, option: str, bad: Any) -> None:
    with pytest.raises(SubagentControlError) as raised:
        SqlStore(sqlite_url, **{option: bad})
    assert raised.value.code == ErrorCode.INVALID_INPUT
    assert option in raised.value.message
