"""The Task table's partial indexes: what a sweep and a drain read, and the upgrade of a
store whose indexes held every Task (schema version 4)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from controlplane import TaskOutcome, TaskSnapshot, TaskStatus
from controlplane.contract import utcnow
from persistence import RetryPolicy, SqlStore
from persistence._schema import NEWEST_TASK_INDEX, SCHEMA_VERSION
from tests.persistence.conftest import raw_engine

PARTIAL = ("ix_subagent_tasks_notices", "ix_subagent_tasks_running")

VERSION_4_INDEXES = (
    "CREATE INDEX ix_subagent_tasks_notices ON subagent_tasks (owner_session, notice_pending)",
    "CREATE INDEX ix_subagent_tasks_running ON subagent_tasks (status, runtime_id)",
    "CREATE INDEX ix_subagent_tasks_child ON subagent_tasks (child_id, created_at)",
)


def task(owner: str = "parent-1") -> TaskSnapshot:
    return TaskSnapshot(
        id=str(uuid.uuid4()),
        label="review the migration",
        owner_session=owner,
        status=TaskStatus.RUNNING,
        child_id="child-1",
        runtime_id="runtime-1",
        created_at=utcnow(),
    )


def statements_of(store: SqlStore, calls: list[Callable[[], object]]) -> list[tuple[str, Any]]:
    """The SQL (with its parameters) that ``calls`` ran against the Task table."""
    seen: list[tuple[str, Any]] = []

    def grab(*args: Any) -> None:
        _conn, _cursor, statement, params, _context, _many = args
        if "subagent_tasks" in statement:
            seen.append((statement, params))

    engine = store._db.engine
    sa.event.listen(engine, "before_cursor_execute", grab)
    try:
        for call in calls:
            call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", grab)
    return seen


def index_definitions(url: str) -> dict[str, str]:
    engine = raw_engine(url)
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            rows = conn.execute(
                sa.text(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                    "AND tbl_name = 'subagent_tasks' AND sql IS NOT NULL"
                )
            )
        else:
            rows = conn.execute(
                sa.text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'subagent_tasks'"
                    " AND schemaname = current_schema() AND indexname LIKE 'ix_%'"
                )
            )
        found = {str(name): str(sql) for name, sql in rows}
    engine.dispose()
    return found


def test_the_sweep_and_the_drain_read_only_the_partial_indexes(store_url: str) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        statements = statements_of(
            store,
            [
                lambda: store.ledger.running(["runtime-1", "runtime-2"]),
                store.ledger.runtimes,
                lambda: store.ledger.drain("parent-1"),
            ],
        )
        assert len(statements) == 3
        # Run on a cursor, compiled once per process: the reads of a runtime's sweep.
        sql = store._db.sql
        statements += [(sql.runtimes.suspects, ()), (sql.tasks.awaiting_provider, ())]
        engine = raw_engine(store_url)
        with engine.begin() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:  # its tables are tiny here: make it show what it would use
                conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
            for statement, params in statements:
                explain = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
                plan = [str(row[-1]) for row in conn.exec_driver_sql(explain + statement, params)]
                assert any(name in line for line in plan for name in PARTIAL), (statement, plan)
                if postgres:
                    assert not any("Seq Scan on subagent_tasks" in line for line in plan), plan
                else:
                    for line in plan:  # every visit of the table goes through one of them
                        if "subagent_tasks" in line:
                            assert any(name in line for name in PARTIAL), plan
        engine.dispose()


def test_a_version_4_store_is_upgraded_to_the_partial_indexes_and_keeps_its_tasks(
    store_url: str,
) -> None:
    running, settled = task(), task()
    outcome = TaskOutcome(status=TaskStatus.COMPLETED, output="done")
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        for one in (running, settled):
            store.ledger.admit(one)
        store.ledger.settle((settled.id, outcome, utcnow()))
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        for name in PARTIAL:
            conn.execute(sa.text(f"DROP INDEX {name}"))
        for statement in VERSION_4_INDEXES:
            conn.execute(sa.text(statement))
        conn.execute(sa.text("UPDATE subagent_schema SET version = 4"))
    engine.dispose()

    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        definitions = index_definitions(store_url)
        assert sorted(definitions) == sorted(
            ["ix_subagent_tasks_owner", NEWEST_TASK_INDEX, *PARTIAL]
        )
        for name in PARTIAL:
            assert "WHERE" in definitions[name].upper(), definitions[name]
        assert store.ledger.get(running.id) == running
        assert [t.id for t in store.ledger.running(["runtime-1"])] == [running.id]
        assert [t.id for t in store.ledger.drain("parent-1")] == [settled.id]
        assert store.ledger.drain("parent-1") == []
    engine = raw_engine(store_url)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION


@pytest.mark.parametrize("status", [TaskStatus.COMPLETED, TaskStatus.INTERRUPTED])
def test_a_notice_is_found_by_the_drain_once_and_a_running_task_by_the_sweep_until_it_settles(
    store_url: str, status: TaskStatus
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        mine, other = task(), task(owner="parent-2")
        for one in (mine, other):
            store.ledger.admit(one)
        assert store.ledger.drain("parent-1") == []
        assert {t.id for t in store.ledger.running(["runtime-1"])} == {mine.id, other.id}

        store.ledger.settle((mine.id, TaskOutcome(status=status, detail="x"), utcnow()))

        assert [t.id for t in store.ledger.running(["runtime-1"])] == [other.id]
        assert [t.id for t in store.ledger.drain("parent-1")] == [mine.id]
        assert store.ledger.drain("parent-1") == []
        assert store.ledger.drain("parent-2") == []
