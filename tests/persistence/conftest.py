"""Fixtures for the store tests: a store per backend, and ways to make the database fail."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import strategies as st

from controlplane import ChildMeta, NewEvent
from persistence import RetryPolicy, SqlStore


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """A store on each backend that retries without waiting."""
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as opened:
        yield opened


def new_child(store: SqlStore, *, parent: str = "parent-1", **fields: Any) -> ChildMeta:
    """Create a child with no events and return its header."""
    meta = ChildMeta(
        child_id=fields.pop("child_id", str(uuid.uuid4())),
        parent_session=parent,
        depth=fields.pop("depth", 1),
        **fields,
    )
    store.create_child(meta)
    return meta


def message(n: int, *, turn: int = 1, kind: str = "assistant/message") -> NewEvent:
    """An event whose data says which one it is."""
    return NewEvent(kind=kind, turn=turn, data={"n": n, "text": f"message {n}"})


def transient_error(url: str) -> Exception:
    """A real driver error of ``url``'s backend that the retry policy treats as transient."""
    if url.startswith("sqlite"):
        return sqlite3.OperationalError("database is locked")
    import psycopg

    return psycopg.errors.SerializationFailure("could not serialize access (test)")


def with_pg_options(url: str, *options: str) -> str:
    """``url`` with more libpq ``-c`` options (kept beside the fixture's search_path)."""
    parsed = sa.make_url(url)
    current = parsed.query.get("options", "")
    assert isinstance(current, str)
    return parsed.update_query_dict(
        {"options": " ".join([current, *options]).strip()}
    ).render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """A PostgreSQL store URL as psycopg.connect takes it."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def raw_engine(url: str) -> sa.Engine:
    """A plain SQLAlchemy engine on the store's database, for the test's own SQL."""
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def as_version_1(url: str) -> None:
    """Turn a store into what version 1 of this code wrote: every event an open row (no
    segments table) and a ``last_seq`` column in every header."""
    engine = raw_engine(url)
    with engine.begin() as conn:
        segments = conn.execute(sa.text("SELECT child_id, events, batches FROM subagent_segments"))
        for child_id, events, batches in segments.all():
            batch_of = {
                seq: batch_id
                for batch_id, first, last in json.loads(batches)
                for seq in range(first, last + 1)
            }
            conn.execute(
                sa.text(
                    "INSERT INTO subagent_events (child_id, seq, turn, kind, data, source, "
                    "batch_id, created_at) VALUES (:child, :seq, :turn, :kind, :data, :source, "
                    ":batch, :stamp)"
                ),
                [
                    {
                        "child": child_id,
                        "seq": seq,
                        "turn": turn,
                        "kind": kind,
                        "data": json.dumps(data),
                        "source": source,
                        "batch": batch_of[seq],
                        "stamp": _stored_stamp(conn, stamp),
                    }
                    for seq, turn, kind, data, source, stamp in json.loads(events)
                ],
            )
        conn.execute(sa.text("DROP TABLE subagent_segments"))
        conn.execute(sa.text("ALTER TABLE subagent_children ADD COLUMN last_seq INTEGER"))
        conn.execute(
            sa.text(
                "UPDATE subagent_children SET last_seq = (SELECT coalesce(max(seq), 0) "
                "FROM subagent_events e WHERE e.child_id = subagent_children.child_id)"
            )
        )
        conn.execute(sa.text("UPDATE subagent_schema SET version = 1"))
    engine.dispose()


def _stored_stamp(conn: sa.Connection, stamp: str) -> object:
    """A segment's ISO timestamp as an open row stores it on this backend."""
    return stamp if conn.dialect.name == "sqlite" else datetime.fromisoformat(stamp)


# -- a second connection that holds the locks the store needs ----------------------------


class LockHolder:
    """Another connection to a store's database, taking locks in an open transaction until
    `release` (as a stuck transaction of another process would)."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            self._lite = sqlite3.connect(
                sa.make_url(url).database or "", isolation_level=None, check_same_thread=False
            )
        else:
            import psycopg

            self._pg = psycopg.connect(libpq_url(url))

    def hold_child(self, child_id: str) -> None:
        """What an append to ``child_id`` waits for: on PostgreSQL the child's header row
        (``SELECT … FOR UPDATE``), on SQLite the whole file (``BEGIN EXCLUSIVE``)."""
        if self.sqlite:
            self._lite.execute("BEGIN EXCLUSIVE")
        else:
            self._pg.execute(
                "SELECT 1 FROM subagent_children WHERE child_id = %s FOR UPDATE", (child_id,)
            )

    def hold_table(self, table: str) -> None:
        """PostgreSQL: an ACCESS EXCLUSIVE lock on ``table``, which even reads wait for."""
        self._pg.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

    def release(self) -> None:
        if self.sqlite:
            if self._lite.in_transaction:
                self._lite.execute("ROLLBACK")
        else:
            self._pg.rollback()

    def close(self) -> None:
        self.release()
        (self._lite if self.sqlite else self._pg).close()


@contextmanager
def lock_holder(url: str) -> Iterator[LockHolder]:
    holder = LockHolder(url)
    try:
        yield holder
    finally:
        holder.close()


# -- retries: a policy that records them, and a commit whose acknowledgement is lost --------

RetryLog = list[tuple[int, BaseException]]


@pytest.fixture
def retries() -> RetryLog:
    return []


def recording(log: RetryLog, then: Callable[[], None] | None = None) -> RetryPolicy:
    """A no-wait policy that records each retry (and runs ``then`` after the first)."""

    def on_retry(attempt: int, error: BaseException) -> None:
        log.append((attempt, error))
        if then is not None and len(log) == 1:
            then()

    return RetryPolicy.immediate(max_attempts=10_000, max_total_s=30, on_retry=on_retry)


class LostAck:
    """The test seam's hook: fail right after the first commit, as if its ack were lost."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.fired = 0

    def __call__(self) -> None:
        if self.fired == 0:
            self.fired += 1
            raise self.error


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)
"""Any plain JSON value, nested a few levels."""
