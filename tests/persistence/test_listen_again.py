"""`SqlStore.listen_again`: every listener on the store (forwarded messages and answers,
admission slots) drops its connection and listens on a new one, and hears what is sent
after (PostgreSQL; SQLite has no listeners). The runtime calls it when its renewals come
back after failing: a connection that lived through an outage can hold notifications back
for seconds (`persistence._listening`)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from persistence import RetryPolicy, SqlStore
from persistence._inbox import channel_of
from persistence._queue_sql import CHANNEL
from tests.support import WAIT_S, eventually

pytestmark = pytest.mark.postgres

RUNTIME = "listening-runtime"


@pytest.fixture
def store(pg_url: str) -> Iterator[SqlStore]:
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as opened:
        yield opened


def _backends(url: str, channel: str) -> set[int]:
    """The server processes listening on ``channel``."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{channel}"',)
        ).fetchall()
    return {row[0] for row in rows}


def _notify(url: str, channel: str, payload: str) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
        conn.commit()


def test_every_listener_of_the_store_listens_again_on_a_new_connection_and_hears_on(
    store: SqlStore, pg_url: str
) -> None:
    assert store.inbox is not None
    replies: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
    releases: queue.Queue[None] = queue.Queue()
    inbox = store.inbox.listen(
        RUNTIME, on_message=lambda *_: None, on_reply=lambda i, a: replies.put((i, a))
    )
    admission = store.queue.listen(lambda: releases.put(None))
    assert admission is not None
    try:
        assert inbox.wait_ready(WAIT_S)
        assert admission.ready.wait(WAIT_S)
        channel = channel_of(RUNTIME)
        before = _backends(pg_url, channel) | _backends(pg_url, CHANNEL)
        assert len(before) == 2

        assert store.listen_again() == 2
        eventually(
            lambda: inbox.listening.connections == 2 and admission.listening.connections == 2,
            "both listening on new connections",
        )
        eventually(lambda: not (_backends(pg_url, channel) | _backends(pg_url, CHANNEL)) & before,
                   "the old connections closed")  # fmt: skip
        assert len(_backends(pg_url, channel) | _backends(pg_url, CHANNEL)) == 2

        _notify(pg_url, channel, 'r:inbox-1:{"route": "steered"}')
        assert replies.get(timeout=WAIT_S) == ("inbox-1", {"route": "steered"})
        _notify(pg_url, CHANNEL, "released")
        assert releases.get(timeout=WAIT_S) is None
    finally:
        inbox.close()
        admission.close()
    assert store.listen_again() == 0  # closed listeners are no longer the store's


def test_listeners_of_another_store_are_left_alone(store: SqlStore, pg_url: str) -> None:
    assert store.inbox is not None
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as other:
        assert other.inbox is not None
        theirs = other.inbox.listen(RUNTIME, on_message=lambda *_: None, on_reply=lambda *_: None)
        try:
            assert theirs.wait_ready(WAIT_S)
            assert store.listen_again() == 0
            assert theirs.listening.connections == 1
        finally:
            theirs.close()
