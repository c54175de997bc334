"""A Task row keeps what its turn spent (schema version 7): summed from the turn's events by
the transaction that settles it, whichever path settles it (the turn's own end, a late
settlement, a sweep of a dead runtime's Task), read back by any store after a restart,
and absent (zero) from a store older than version 7 read as it is."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from controlplane.contract import (
    ChildMeta,
    EventKind,
    NewEvent,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    Usage,
    utcnow,
)
from persistence import SqlStore
from persistence._schema import SCHEMA_VERSION
from tests.persistence.conftest import raw_engine

RUNTIME = "runtime-gone"
CALL = {"input_tokens": 100, "output_tokens": 20, "model_calls": 1, "cost": 0.25}
TOOL = {"tool_calls": 1}
TURN_SPEND = Usage(input_tokens=100, output_tokens=20, model_calls=1, tool_calls=1, cost=0.25)


def admitted(store: SqlStore, child_id: str) -> TaskSnapshot:
    task = TaskSnapshot(
        id=str(uuid.uuid4()), label="job", owner_session="parent-1",
        status=TaskStatus.RUNNING, child_id=child_id, runtime_id=RUNTIME, created_at=utcnow(),
    )  # fmt: skip
    store.ledger.admit(task)
    return task


def turn(task_id: str, n: int, *, seed_usage: bool = False) -> list[NewEvent]:
    seed = (
        [
            NewEvent(
                kind=EventKind.ASSISTANT_MESSAGE,
                turn=0,
                data={"text": "the parent's", "usage": {"input_tokens": 999}},
            )
        ]
        if seed_usage
        else []
    )
    return [
        *seed,
        NewEvent(kind=EventKind.TURN_START, turn=n, data={"task_id": task_id}),
        NewEvent(kind=EventKind.USER_MESSAGE, turn=n, data={"text": "go"}),
        NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=n, data={"text": "a", "usage": CALL}),
        NewEvent(kind="tool/result", turn=n, data={"id": "c1", "output": "x", "usage": TOOL}),
    ]


def new_child(store: SqlStore, *, seed_usage: bool = False) -> tuple[str, TaskSnapshot]:
    child_id = str(uuid.uuid4())
    task = admitted(store, child_id)
    meta = ChildMeta(
        child_id=child_id, parent_session="parent-1", depth=1,
        seed_length=1 if seed_usage else 0, created_at=utcnow(), label="job",
    )  # fmt: skip
    store.create_child(meta, turn(task.id, 1, seed_usage=seed_usage), claim=(RUNTIME, task.id))
    return child_id, task


def test_a_turns_end_writes_its_tasks_spend_with_its_settlement_and_a_reopened_store_reads_it(
    store_url: str,
) -> None:
    with SqlStore(store_url) as store:
        child_id, task = new_child(store, seed_usage=True)  # a fork's seed is not its spend
        assert store.ledger.get(task.id).usage == Usage.zero()  # type: ignore[union-attr]
        outcome = TaskOutcome(status=TaskStatus.COMPLETED, output="a")
        store.append(
            child_id,
            [NewEvent(kind=EventKind.TURN_END, turn=1, data={"status": "completed"})],
            settle=(task.id, outcome, utcnow()),
            fence=(RUNTIME, 1),
        )

    with SqlStore(store_url) as reopened:
        got = reopened.ledger.get(task.id)
        assert got is not None
        assert got.usage == TURN_SPEND
        assert [t.usage for t in reopened.ledger.owned_by("parent-1")] == [TURN_SPEND]
        assert [t.usage for t in reopened.ledger.recent("parent-1")] == [TURN_SPEND]
        assert [t.usage for t in reopened.ledger.drain("parent-1")] == [TURN_SPEND]


def test_a_dead_runtimes_task_settled_by_a_sweep_keeps_what_its_open_turn_wrote(
    store_url: str,
) -> None:
    with SqlStore(store_url) as store:
        _child_id, task = new_child(store)

        assert store.interrupt(task, "interrupted: its runtime ended")
        assert not store.interrupt(task, "again")  # once

    with SqlStore(store_url) as reopened:
        got = reopened.ledger.get(task.id)
        assert got is not None
        assert got.status is TaskStatus.INTERRUPTED
        assert got.usage == TURN_SPEND


def test_a_late_settlement_that_closes_its_turn_keeps_the_turns_spend_and_a_second_turn_its_own(
    store_url: str,
) -> None:
    with SqlStore(store_url) as store:
        child_id, first = new_child(store)
        failed = TaskOutcome(status=TaskStatus.FAILED, detail="the store was out")
        assert store.ledger.settle((first.id, failed, utcnow()))
        second = TaskSnapshot(
            id=str(uuid.uuid4()), label="again", owner_session="parent-1",
            status=TaskStatus.RUNNING, child_id=child_id, runtime_id=RUNTIME, created_at=utcnow(),
        )  # fmt: skip
        fence = store.admit_claiming(second, is_dead=lambda *_: True)  # a resume's claim
        assert fence is not None
        store.append(child_id, turn(second.id, 2)[:3], fence=(RUNTIME, fence))
        done = TaskOutcome(status=TaskStatus.COMPLETED, output="b")
        store.append(
            child_id,
            [NewEvent(kind=EventKind.TURN_END, turn=2, data={"status": "completed"})],
            settle=(second.id, done, utcnow()),
            fence=(RUNTIME, fence),
        )

        spends: dict[str, Any] = {t.id: t.usage for t in store.ledger.owned_by("parent-1")}
        assert spends == {
            first.id: TURN_SPEND,
            second.id: Usage(input_tokens=100, output_tokens=20, model_calls=1, cost=0.25),
        }


def test_a_store_older_than_version_7_reads_as_it_is_with_no_spend_then_migrates(
    store_url: str,
) -> None:
    with SqlStore(store_url) as store:
        _child_id, task = new_child(store)
        store.interrupt(task, "interrupted")
    engine = raw_engine(store_url)
    with engine.begin() as conn:  # what version 6 wrote: no spend column
        conn.execute(sa.text("ALTER TABLE subagent_tasks DROP COLUMN spend"))
        conn.execute(sa.text("UPDATE subagent_schema SET version = 6"))

    with SqlStore(store_url, read_only=True) as old:
        (read,) = old.ledger.recent()
        assert read.status is TaskStatus.INTERRUPTED
        assert read.usage == Usage.zero()
        assert old.ledger.get(task.id) == read
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar() == 6

    with SqlStore(store_url) as migrated:
        got = migrated.ledger.get(task.id)
        assert got is not None
        assert got.usage == Usage.zero()
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar() == SCHEMA_VERSION
        )
        columns = {c["name"] for c in sa.inspect(conn).get_columns("subagent_tasks")}
        assert "spend" in columns
    engine.dispose()
