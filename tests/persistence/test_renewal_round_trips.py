"""On PostgreSQL a lease renewal is one statement, and a new connection sends none of its
own before its first use: on a slow link each round trip comes out of the margin a
renewal has between an outage's heal and the fence."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from persistence import SqlStore

pytestmark = pytest.mark.postgres


@contextmanager
def sent_statements() -> Iterator[list[str]]:
    """Every statement a psycopg cursor or connection executes meanwhile, in order
    (``BEGIN`` and ``COMMIT`` included when they are sent as statements)."""
    sent: list[str] = []
    cursor_execute = psycopg.Cursor.execute
    connection_execute = psycopg.Connection.execute
    connection_commit = psycopg.Connection.commit

    def on_cursor(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return cursor_execute(self, query, *args, **kwargs)

    def on_connection(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return connection_execute(self, query, *args, **kwargs)

    def on_commit(self: psycopg.Connection[Any]) -> None:
        if self.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            sent.append("COMMIT")  # psycopg sends nothing when no transaction is open
        connection_commit(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(psycopg.Cursor, "execute", on_cursor)
    mp.setattr(psycopg.Connection, "execute", on_connection)
    mp.setattr(psycopg.Connection, "commit", on_commit)
    try:
        yield sent
    finally:
        mp.undo()


def test_a_renewal_is_one_statement_that_commits_on_its_own(pg_url: str) -> None:
    with SqlStore(pg_url) as store:
        store.ledger.register_runtime("r", host="h", pid=1, boot_id=None, lease_ttl_s=3.0)
        before = store.ledger.runtime("r")
        assert before is not None
        with sent_statements() as sent:
            assert store.ledger.heartbeat("r") is True
        assert len(sent) == 1, sent
        assert sent[0].startswith("UPDATE"), sent
        after = store.ledger.runtime("r")
        assert after is not None
        assert after.heartbeat_at >= before.heartbeat_at
        # A closed runtime's row is not renewed, and says so.
        store.ledger.close_runtime("r")
        assert store.ledger.heartbeat("r") is False


def test_a_new_connection_is_named_and_in_utc_with_no_statement_of_its_own(
    pg_url: str,
) -> None:
    name = "renewal-rt"
    with SqlStore(f"{pg_url}&application_name={name}") as store:
        store.name_sessions("runtime-1")
        with sent_statements() as sent:
            raw = store._db.engine.raw_connection()  # a new one: naming emptied the pool
        try:
            assert sent == []
            cursor = raw.cursor()
            cursor.execute(
                "SELECT current_setting('application_name'), current_setting('TimeZone')"
            )
            ((application_name, zone),) = cursor.fetchall()
        finally:
            raw.close()
        assert application_name.startswith(f"{name} ")
        assert zone == "UTC"
