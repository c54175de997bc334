"""Every wait a store call can make on an activation's path ends once it is abandoned
(`persistence._deadlines.abandoning`), the connection pool's included, and a lease
renewal never queues behind other calls for a pooled connection.

A fenced activation must be quiescent within a quarter of the lease. The recovery stress
run saw one outlive its runtime's fence by 4.6 s (2 double activations): the store's pool
(15 connections) was taken by calls stuck on the cut, and the pool's checkout wait (30 s)
was cut neither by the fence nor by a call's deadline; the runtime's renewals queued
behind the same calls.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import tenacity

from persistence import RetryPolicy, SqlStore
from persistence._deadlines import abandoning, call_deadline

BOUND_S = 1.0
"""How soon an abandoned call must end (the promise is 0.1 s; slack for a loaded host)."""


@contextmanager
def _exhausted(store: SqlStore) -> Iterator[None]:
    """Every connection the store's pool may open is checked out for the block."""
    engine = store._db.engine
    pool: Any = engine.pool
    held = [engine.raw_connection() for _ in range(pool.size() + pool._max_overflow)]
    try:
        yield
    finally:
        for conn in held:
            conn.close()


def _in_thread(call: Any, abandoned: threading.Event) -> tuple[threading.Thread, list[Any]]:
    ended: list[Any] = []

    def run() -> None:
        with abandoning(abandoned.is_set):
            try:
                ended.append(call())
            except BaseException as exc:
                ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, ended


@pytest.mark.postgres
def test_a_call_waiting_for_a_pooled_connection_ends_once_abandoned(pg_url: str) -> None:
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as store, _exhausted(store):
        abandoned = threading.Event()
        thread, ended = _in_thread(store.list_children, abandoned)
        time.sleep(0.3)  # the call is waiting for a connection (a schedule, not a sync)
        assert thread.is_alive()
        assert not ended, ended
        began = time.monotonic()
        abandoned.set()
        thread.join(10.0)
        took = time.monotonic() - began
    assert not thread.is_alive()
    assert ended
    assert isinstance(ended[0], BaseException), ended
    assert took < BOUND_S, f"the abandoned checkout went on for {took:.2f}s"  # before: 30 s


@pytest.mark.postgres
def test_a_call_waiting_for_a_pooled_connection_ends_at_its_deadline(pg_url: str) -> None:
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as store, _exhausted(store):
        began = time.monotonic()
        with pytest.raises(Exception), call_deadline(0.3):  # noqa: B017,PT011 (any failure)
            store.list_children()
        took = time.monotonic() - began
    assert took < 0.3 + BOUND_S, f"the checkout outlived its deadline: {took:.2f}s"


@pytest.mark.postgres
def test_a_renewal_never_queues_for_a_pooled_connection(pg_url: str) -> None:
    with SqlStore(pg_url, retry=RetryPolicy.immediate()) as store:
        runtime_id = f"r-{uuid.uuid4().hex[:8]}"
        store.ledger.register_runtime(runtime_id, host="h", pid=1, boot_id=None, lease_ttl_s=3.0)
        with _exhausted(store):
            began = time.monotonic()
            with call_deadline(1.0):
                assert store.ledger.heartbeat(runtime_id) is True
            took = time.monotonic() - began
        assert took < BOUND_S, f"the renewal waited {took:.2f}s"
        # The connection it opened past the pool's size is closed on its return: the pool
        # keeps its size.
        pool: Any = store._db.engine.pool
        assert pool.checkedout() == 0
        assert pool.overflow() <= pool._max_overflow


def test_a_retry_waiting_out_its_backoff_ends_once_abandoned(sqlite_url: str) -> None:
    abandoned = threading.Event()
    attempts: list[int] = []
    policy = RetryPolicy(max_total_s=60.0, on_retry=lambda _n, _e: abandoned.set())
    with SqlStore(sqlite_url, retry=policy) as store:
        store._retrier._retrying.wait = tenacity.wait_fixed(20.0)

        def operation(attempt: int) -> None:
            import sqlite3

            attempts.append(attempt)
            raise sqlite3.OperationalError("database is locked")

        began = time.monotonic()
        thread, ended = _in_thread(lambda: store._run("fail", operation), abandoned)
        thread.join(30.0)
        took = time.monotonic() - began
    assert not thread.is_alive()
    assert ended
    assert isinstance(ended[0], BaseException), ended
    assert attempts == [1], attempts  # no attempt after it was abandoned
    assert took < BOUND_S, f"the abandoned retry slept {took:.2f}s"  # before: 20 s
