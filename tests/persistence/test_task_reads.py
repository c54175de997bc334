"""A stored Task's read: on a connection kept between reads, never a stale one, and the
snapshot it builds is the one validation would build."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError

from controlplane import ErrorCode, TaskOutcome, TaskSnapshot, TaskStatus
from controlplane.contract import utcnow
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import RetryLog, libpq_url, recording
from tests.support import eventually


def running_task(owner: str = "parent-1", child_id: str | None = "child-1") -> TaskSnapshot:
    return TaskSnapshot(
        id=str(uuid.uuid4()),
        label="review the migration",
        owner_session=owner,
        status=TaskStatus.RUNNING,
        child_id=child_id,
        runtime_id="runtime-1",
        created_at=utcnow(),
    )


OUTCOMES = [
    TaskOutcome(status=TaskStatus.COMPLETED, output="seq stays gapless"),
    TaskOutcome(status=TaskStatus.COMPLETED, output=None),
    TaskOutcome(status=TaskStatus.FAILED, detail="provider error", code=ErrorCode.NOT_RESUMABLE),
    TaskOutcome(status=TaskStatus.KILLED, detail="killed by parent", code=ErrorCode.CANCELLED),
    TaskOutcome(status=TaskStatus.INTERRUPTED, detail="interrupted: its runtime ended"),
]


def test_a_stored_task_read_again_shows_what_another_store_committed_in_between(
    store_url: str,
) -> None:
    with (
        SqlStore(store_url, retry=RetryPolicy.immediate()) as writer,
        SqlStore(store_url, retry=RetryPolicy.immediate()) as reader,
    ):
        for outcome in OUTCOMES:
            task = running_task()
            assert reader.ledger.get(task.id) is None
            writer.ledger.admit(task)
            assert reader.ledger.get(task.id) == task
            writer.ledger.settle((task.id, outcome, utcnow()))
            read = reader.ledger.get(task.id)
            assert read is not None
            assert read.status is outcome.status
            assert read.outcome == outcome


@pytest.mark.parametrize("outcome", [None, *OUTCOMES])
def test_a_stored_task_reads_back_as_the_snapshot_validation_builds(
    store_url: str, outcome: TaskOutcome | None
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        task = running_task(child_id=None if outcome is None else "child-1")
        store.ledger.admit(task)
        settled_at = task.created_at + timedelta(seconds=3)
        if outcome is not None:
            store.ledger.settle((task.id, outcome, settled_at))

        read = store.ledger.get(task.id)
        (listed,) = store.ledger.owned_by(task.owner_session)

    assert read is not None
    expected = task.model_copy(
        update={}
        if outcome is None
        else {
            "status": outcome.status,
            "outcome": outcome,
            "settled_at": settled_at,
            "ended_at": settled_at,
        }
    )
    for snapshot in (read, listed):
        validated = TaskSnapshot.model_validate(snapshot.model_dump())
        assert snapshot == validated == expected
        assert hash(snapshot) == hash(validated)
        assert snapshot.model_dump_json() == validated.model_dump_json()
        constructed = TaskSnapshot.model_construct(**snapshot.model_dump(exclude={"kind"}))
        assert snapshot.model_fields_set == constructed.model_fields_set
        if snapshot.outcome is not None:
            assert snapshot.outcome.model_fields_set == set(TaskOutcome.model_fields)
        with pytest.raises(ValidationError):
            snapshot.label = "changed"  # type: ignore[misc]


def test_reads_from_many_threads_at_once_each_find_their_own_task(store_url: str) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        tasks = [running_task(owner=f"parent-{i}") for i in range(8)]
        for task in tasks:
            store.ledger.admit(task)
        start = threading.Barrier(len(tasks))
        wrong: list[object] = []

        def read(task: TaskSnapshot) -> None:
            start.wait(timeout=10)
            for _ in range(200):
                found = store.ledger.get(task.id)
                if found != task:
                    wrong.append(found)

        threads = [threading.Thread(target=read, args=(task,)) for task in tasks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    assert not wrong


def test_a_forked_child_reads_without_the_parents_read_connection_and_leaves_it_working(
    sqlite_url: str,
) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        task = running_task()
        store.ledger.admit(task)
        assert store.ledger.get(task.id) == task  # the parent's read connection is open
        child = multiprocessing.get_context("fork").Process(
            target=_read_in_child, args=(store, task)
        )
        child.start()
        child.join(timeout=30)
        assert child.exitcode == 0
        assert store.ledger.get(task.id) == task


def _read_in_child(store: SqlStore, task: TaskSnapshot) -> None:
    found = store.ledger.get(task.id)
    store.close()  # leaves the parent's connection alone
    raise SystemExit(0 if found == task else 1)


@pytest.mark.postgres
def test_a_dropped_postgresql_read_connection_is_replaced_and_the_read_retried(
    pg_url: str, retries: RetryLog
) -> None:
    import psycopg

    name = f"store-{uuid.uuid4().hex[:8]}"
    with SqlStore(f"{pg_url}&application_name={name}", retry=recording(retries)) as store:
        task = running_task()
        store.ledger.admit(task)
        assert store.ledger.get(task.id) == task  # the read connection is open now
        with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchall():
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

        assert store.ledger.get(task.id) == task
        assert retries, "the dead read connection should have failed one attempt"
        assert store.ledger.get(task.id) == task


@pytest.mark.postgres
def test_closing_the_store_closes_its_read_connection(pg_url: str) -> None:
    import psycopg

    name = f"store-{uuid.uuid4().hex[:8]}"
    with SqlStore(f"{pg_url}&application_name={name}") as store:
        task = running_task()
        store.ledger.admit(task)
        assert store.ledger.get(task.id) == task
    # A closed connection's server process exits after the client has gone, so it may
    # still be listed for a moment: wait (bounded) until none of the store's is.
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:

        def none_left() -> bool:
            (left,) = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone() or (None,)
            return left == 0

        eventually(none_left, "the store's connections are gone from the server")


def test_one_runtime_is_read_by_id_as_the_listing_shows_it(store_url: str) -> None:
    # A kill of a Task held elsewhere reads the one runtime it needs, not every runtime.
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        ledger = store.ledger
        for n in range(3):
            ledger.register_runtime(f"runtime-{n}", host="h", pid=n, boot_id=None, lease_ttl_s=5)
        mine = running_task()
        ledger.admit(mine.model_copy(update={"runtime_id": "runtime-1"}))
        ledger.close_runtime("runtime-2")
        listed = {runtime.runtime_id: runtime for runtime in ledger.runtimes()}
        for runtime_id, info in listed.items():
            assert ledger.runtime(runtime_id) == info
        holder = ledger.runtime("runtime-1")
        assert holder is not None
        assert holder.running_tasks == 1
        assert ledger.runtime("no-such-runtime") is None
