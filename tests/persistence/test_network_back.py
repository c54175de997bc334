"""`SqlStore.network_back`: every listener on the store (forwarded messages and answers,
admission slots) drops its connection and listens on a new one, and hears what is sent
after; every store call still waiting since before the moment given is ended and retried
on a new connection (PostgreSQL; SQLite has neither). The runtime calls it when its
renewals come back after failing: a connection that lived through an outage can hold
notifications back, or sit in TCP's retransmission, for seconds (`persistence._listening`,
`persistence._deadlines`)."""

from __future__ import annotations

import queue
import threading
import time
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

        assert store.network_back(time.monotonic()) == 2
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
    assert store.network_back(time.monotonic()) == 0  # closed listeners are no longer the store's


def test_listeners_of_another_store_are_left_alone(store: SqlStore, pg_url: str) -> None:
    assert store.inbox is not None
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as other:
        assert other.inbox is not None
        theirs = other.inbox.listen(RUNTIME, on_message=lambda *_: None, on_reply=lambda *_: None)
        try:
            assert theirs.wait_ready(WAIT_S)
            assert store.network_back(time.monotonic()) == 0
            assert theirs.listening.connections == 1
        finally:
            theirs.close()


def test_a_call_waiting_since_before_the_network_came_back_is_retried_on_a_new_connection(
    pg_url: str,
) -> None:
    from persistence._deadlines import _REAPER
    from tests.reliability.pg_fault import TcpProxy

    with TcpProxy(5432) as proxy, SqlStore(proxy.url(pg_url)) as store:
        assert store.ledger.get("warm-up") is None
        retried: list[str] = []
        store.on_retry(lambda action, _attempt, _cause: retried.append(action))
        proxy.hold()  # the wait below sits on a connection no byte passes
        answers: list[object] = []
        reader = threading.Thread(target=lambda: answers.append(store.ledger.get("task-1")))
        try:
            reader.start()
            eventually(lambda: bool(_REAPER._waits), "the read waiting on the held connection")
            store.network_back(time.monotonic())
            # Its wait ended and the read is tried again (before: it waited for the
            # store's silence bound, 32 s, on the same connection).
            eventually(lambda: bool(retried), "the read retried")
        finally:
            proxy.release()
            reader.join(WAIT_S)
        assert answers == [None]


def test_the_waits_of_another_store_of_the_process_are_left_alone(pg_url: str) -> None:
    # Two stores in one process, each on a network of its own: one's network coming back
    # says nothing of the other's, whose call may be waiting on a healthy connection.
    from persistence._deadlines import _REAPER
    from tests.reliability.pg_fault import TcpProxy

    with (
        TcpProxy(5432) as ours_proxy, TcpProxy(5432) as theirs_proxy,
        SqlStore(ours_proxy.url(pg_url)) as ours, SqlStore(theirs_proxy.url(pg_url)) as theirs,
    ):  # fmt: skip
        assert ours.ledger.get("warm-up") is None
        assert theirs.ledger.get("warm-up") is None
        answers: list[object] = []
        readers = {
            name: threading.Thread(target=lambda s=store: answers.append(s.ledger.get("task-1")))
            for name, store in (("ours", ours), ("theirs", theirs))
        }
        ours_proxy.hold()
        theirs_proxy.hold()
        try:
            for reader in readers.values():
                reader.start()

            def waits(name: str) -> set[int]:
                return {t for t, w in list(_REAPER._waits.items()) if w[2] == readers[name].ident}

            eventually(lambda: bool(waits("ours") and waits("theirs")), "both reads waiting")
            ours_wait, theirs_wait = waits("ours"), waits("theirs")
            ours.network_back(time.monotonic())
            assert not ours_wait & set(_REAPER._waits)  # cut: tried again on a new connection
            # Before: cut too, although its network never went.
            assert theirs_wait <= set(_REAPER._waits)
        finally:
            ours_proxy.release()
            theirs_proxy.release()
            for reader in readers.values():
                reader.join(WAIT_S)
        assert answers == [None, None]
