"""SQLite reads a sealed segment's events as a BLOB: the JSON decoder takes the stored
UTF-8 bytes as they are, where a TEXT value would first be decoded into a str (a copy of
every sealed event; of any non-ASCII text, a decode and then a re-encode for orjson).
PostgreSQL reads text, as before."""

from __future__ import annotations

from controlplane import EventKind, NewEvent
from persistence import SqlStore
from tests.persistence.conftest import new_child


def test_a_sealed_turn_reaches_the_decoder_as_bytes_on_sqlite_and_reads_back_unchanged(
    store: SqlStore, store_url: str
) -> None:
    meta = new_child(store)
    written = store.append(
        meta.child_id,
        [
            NewEvent(kind="assistant/message", turn=1, data={"text": 'héllo ☃ 日本語 "q" \\'}),
            NewEvent(kind="tool/result", turn=1, data={"big": 2**80}),  # the exact decoder
            NewEvent(kind=EventKind.TURN_END, turn=1, data={"status": "completed"}),
        ],
    )

    sql = store._db.sql.children
    with store._db.cursor(write=False) as cursor:
        cursor.execute(sql.events, (meta.child_id,) * sql.events_binds)
        rows = cursor.fetchall()
    assert [row[1] for row in rows] == [None]  # one segment, no open row
    stored = rows[0][3]
    assert isinstance(stored, bytes if store_url.startswith("sqlite") else str)
    assert store.load(meta.child_id).events == written
