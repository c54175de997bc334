"""Every statement is bounded: a lock held by a stuck transaction, or a statement that runs
too long, becomes a transient failure that the retry policy handles, never a wait forever.

The per-test timeouts turn a wait that the bounds failed to stop into a failure.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controlplane import ErrorCode, SubagentControlError
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import (
    RetryLog,
    lock_holder,
    message,
    new_child,
    recording,
    with_pg_options,
)


@pytest.mark.timeout(20)
def test_an_append_behind_a_lock_held_by_a_stuck_transaction_fails_store_unavailable_in_time(
    store_url: str, retries: RetryLog
) -> None:
    policy = RetryPolicy.immediate(
        max_attempts=2, on_retry=lambda attempt, error: retries.append((attempt, error))
    )
    with (
        lock_holder(store_url) as holder,
        SqlStore(store_url, retry=policy, lock_timeout_s=0.05) as store,
    ):
        meta = new_child(store)
        holder.hold_child(meta.child_id)  # and never lets go, until the test says so

        with pytest.raises(SubagentControlError) as raised:
            store.append(meta.child_id, [message(1)])

        assert raised.value.code == ErrorCode.STORE_UNAVAILABLE
        assert "lock" in raised.value.message.lower()
        assert [attempt for attempt, _ in retries] == [1]
        holder.release()
        stored = store.append(meta.child_id, [message(2)])
        assert [e.seq for e in stored] == [1]
        assert store.load(meta.child_id).events == stored


@pytest.mark.postgres
@pytest.mark.timeout(30)
def test_a_read_that_outlasts_the_statement_timeout_is_retried(
    pg_url: str, retries: RetryLog
) -> None:
    first_retry = threading.Event()
    # The lock wait outlasts the statement: the statement timeout (57014) is what fires.
    with (
        lock_holder(pg_url) as holder,
        SqlStore(
            pg_url,
            retry=recording(retries, then=first_retry.set),
            lock_timeout_s=60,
            statement_timeout_s=0.05,
        ) as store,
    ):
        meta = new_child(store)
        written = store.append(meta.child_id, [message(1)])
        holder.hold_table("subagent_events")
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(store.load, meta.child_id)
            assert first_retry.wait(timeout=20), "the timed-out load was never retried"
            holder.release()
            loaded = pending.result(timeout=20)

    assert loaded.events == written
    assert "statement timeout" in str(retries[0][1]).lower()


def test_every_connection_is_bounded_by_default(store_url: str) -> None:
    with SqlStore(store_url) as store:
        assert _bounds(store) == (
            {"busy_timeout": "5000"}
            if store_url.startswith("sqlite")
            else {"lock_timeout": "5s", "statement_timeout": "30s"}
        )


def test_the_bounds_are_options_and_never_round_down_to_no_bound(store_url: str) -> None:
    with SqlStore(store_url, lock_timeout_s=0.0001, statement_timeout_s=0.25) as store:
        assert _bounds(store) == (
            {"busy_timeout": "1"}
            if store_url.startswith("sqlite")
            else {"lock_timeout": "1ms", "statement_timeout": "250ms"}
        )


def test_a_bound_the_url_sets_itself_wins(store_url: str) -> None:
    if store_url.startswith("sqlite"):
        url, expected = f"{store_url}?timeout=0.125", {"busy_timeout": "125"}
    else:
        url = with_pg_options(store_url, "-clock_timeout=125")
        expected = {"lock_timeout": "125ms", "statement_timeout": "2s"}
    with SqlStore(url, lock_timeout_s=1, statement_timeout_s=2) as store:
        assert _bounds(store) == expected


@pytest.mark.parametrize("option", ["lock_timeout_s", "statement_timeout_s"])
@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5", True, None])
def test_a_bound_must_be_a_positive_number_of_seconds(
    sqlite_url: str, option: str, bad: Any
) -> None:
    with pytest.raises(SubagentControlError) as raised:
        SqlStore(sqlite_url, **{option: bad})
    assert raised.value.code == ErrorCode.INVALID_INPUT
    assert option in raised.value.message


def _bounds(store: SqlStore) -> dict[str, str]:
    """The bounds a connection of the store's own pool runs with."""
    with store._db.engine.connect() as conn:
        if store.url.startswith("sqlite"):
            return {"busy_timeout": str(conn.exec_driver_sql("PRAGMA busy_timeout").scalar())}
        return {
            name: str(conn.exec_driver_sql(f"SHOW {name}").scalar())
            for name in ("lock_timeout", "statement_timeout")
        }
