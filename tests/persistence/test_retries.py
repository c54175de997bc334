"""Transient failures are retried by the one policy, and a retry never writes twice."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import ChildMeta, ErrorCode, SubagentControlError
from persistence import RetryPolicy, SqlStore
from persistence._port import next_batch as _next_batch
from tests.persistence.conftest import (
    LockHolder,
    LostAck,
    RetryLog,
    libpq_url,
    lock_holder,
    message,
    new_child,
    raw_engine,
    recording,
    transient_error,
)

# -- a real lock held by another connection ----------------------------------------------


@contextmanager
def store_behind_a_lock(
    store_url: str, policy: RetryPolicy
) -> Iterator[tuple[SqlStore, str, LockHolder]]:
    """A store with one child, a 50 ms lock wait, and a second connection ready to lock
    what its appends need."""
    child_id = str(uuid.uuid4())
    with (
        lock_holder(store_url) as holder,
        SqlStore(store_url, retry=policy, lock_timeout_s=0.05) as opened,
    ):
        opened.create_child(ChildMeta(child_id=child_id, parent_session="p", depth=1))
        yield opened, child_id, holder


def test_a_write_blocked_by_another_connections_lock_is_retried_until_the_lock_is_freed(
    store_url: str, retries: RetryLog
) -> None:
    first_retry = threading.Event()
    with store_behind_a_lock(store_url, recording(retries, then=first_retry.set)) as (
        store,
        child_id,
        holder,
    ):
        holder.hold_child(child_id)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(store.append, child_id, [message(1)])
            assert first_retry.wait(timeout=30), "the blocked append was never retried"
            holder.release()  # from this thread, while the append keeps retrying
            stored = pending.result(timeout=30)

        assert [e.seq for e in stored] == [1]
        assert store.load(child_id).events == stored
        assert "lock" in str(retries[0][1]).lower()


# -- ambiguous commits -------------------------------------------------------------------


def test_an_append_retried_after_an_unacknowledged_commit_is_written_once(
    store_url: str, retries: RetryLog
) -> None:
    with SqlStore(store_url, retry=recording(retries)) as store:
        meta = new_child(store)
        lost = LostAck(transient_error(store_url))
        store._after_commit = lost  # the documented test seam

        stored = store.append(meta.child_id, [message(1), message(2)])

        store._after_commit = None
        assert lost.fired == 1
        assert len(retries) == 1
        assert [e.seq for e in stored] == [1, 2]
        loaded = store.load(meta.child_id).events
        assert loaded == stored
        assert store.append(meta.child_id, [message(3)])[0].seq == 3


def test_a_create_child_retried_after_an_unacknowledged_commit_is_written_once(
    store_url: str, retries: RetryLog
) -> None:
    with SqlStore(store_url, retry=recording(retries)) as store:
        meta = ChildMeta(child_id=str(uuid.uuid4()), parent_session="p", depth=1)
        lost = LostAck(transient_error(store_url))
        store._after_commit = lost

        stored = store.create_child(meta, [message(1)])

        store._after_commit = None
        assert lost.fired == 1
        assert len(retries) == 1
        assert store.list_children() == [meta]
        assert store.load(meta.child_id).events == stored
        with pytest.raises(SubagentControlError) as raised:
            store.create_child(meta)
        assert raised.value.code == ErrorCode.CHILD_EXISTS


@pytest.mark.postgres
def test_a_dropped_postgresql_connection_is_replaced_and_the_append_retried(
    pg_url: str, retries: RetryLog
) -> None:
    import psycopg

    name = f"store-{uuid.uuid4().hex[:8]}"
    url = f"{pg_url}&application_name={name}"
    with SqlStore(url, retry=recording(retries)) as store:
        meta = new_child(store)
        with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
            pids = [
                pid
                for (pid,) in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
                )
            ]
            assert pids, "the store should hold a pooled connection"
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

        stored = store.append(meta.child_id, [message(1)])

        assert retries, "the dead pooled connection should have failed one attempt"
        assert [e.seq for e in stored] == [1]
        assert store.load(meta.child_id).events == stored


# -- bounds ------------------------------------------------------------------------------


def test_a_store_that_stays_unreachable_fails_with_store_unavailable_after_bounded_attempts(
    retries: RetryLog,
) -> None:
    policy = RetryPolicy.immediate(
        max_attempts=3, on_retry=lambda attempt, error: retries.append((attempt, error))
    )
    with pytest.raises(SubagentControlError) as raised:
        # Nothing listens on port 1: every connection attempt is refused at once.
        SqlStore("postgresql+psycopg://nobody@127.0.0.1:1/none", retry=policy)
    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "open the store" in raised.value.message
    assert [attempt for attempt, _ in retries] == [1, 2]
    assert not isinstance(raised.value, sa.exc.SQLAlchemyError)


def test_retries_stop_when_the_time_budget_is_spent(tmp_path: Path, retries: RetryLog) -> None:
    path = tmp_path / "budget.db"
    policy = RetryPolicy(
        max_attempts=1_000_000,
        max_total_s=0.3,
        initial_backoff_s=0.01,
        max_backoff_s=0.02,
        on_retry=lambda attempt, error: retries.append((attempt, error)),
    )
    with SqlStore(f"sqlite:///{path}?timeout=0.01", retry=policy) as store:
        meta = new_child(store)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(SubagentControlError) as raised:
                store.append(meta.child_id, [message(1)])
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
        assert "database is locked" in raised.value.message
        assert 1 <= len(retries) < 1000
        assert store.load(meta.child_id).events == []


def test_a_permanent_failure_is_not_retried(store_url: str, retries: RetryLog) -> None:
    with SqlStore(store_url, retry=recording(retries)) as watched:
        meta = new_child(watched)
        engine = raw_engine(store_url)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE subagent_events"))
        engine.dispose()
        with pytest.raises(SubagentControlError) as raised:
            watched.append(meta.child_id, [message(1)])
    assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
    assert retries == []


def test_retry_policy_bounds_must_be_sensible() -> None:
    for bad in (
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"max_total_s": 0},
        {"initial_backoff_s": -1},
        {"max_backoff_s": float("inf")},
        {"max_total_s": "10"},
        {"max_attempts": None, "wait": False},  # no wait and no count: it would spin
    ):
        with pytest.raises(SubagentControlError) as raised:
            RetryPolicy(**bad)  # type: ignore[arg-type]
        assert raised.value.code == ErrorCode.INVALID_INPUT
    assert RetryPolicy.immediate().wait is False
    assert RetryPolicy.immediate().max_attempts == 8
    assert RetryPolicy().wait is True


def test_the_default_policy_is_bounded_by_time_alone() -> None:
    # A count bound ran out after ~0.8 s of waits, long before the 20 s budget: a routine
    # PostgreSQL restart failed running turns and steers (tests/reliability/test_outages.py).
    policy = RetryPolicy()
    assert policy.max_attempts is None
    assert policy.max_total_s == 20.0


def test_batch_ids_never_repeat_within_a_process_nor_across_a_fork() -> None:
    ours = {_next_batch() for _ in range(10_000)}
    assert len(ours) == 10_000
    assert all(len(batch) == 32 for batch in ours)

    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        theirs = set(pool.apply(_batches, (1_000,)))
    # A forked child draws its own random bits, so it cannot replay the parent's ids.
    assert not theirs & ours
    assert {batch[:16] for batch in theirs}.isdisjoint({batch[:16] for batch in ours})


def _batches(count: int) -> list[str]:
    return [_next_batch() for _ in range(count)]
