"""What the console's overview reads of every child (`StoreOverview`): each child's newest
Task through the child's index, one seek per child, not a scan of every Task ever run,
with the same answer as the scan it replaced; each child's provider and model from its
header. A store older than both (version 10) gains them when it is opened (the names
copied from the descriptors it holds, open or sealed), while a read-only open of it reads
it as it is: by the scan, without names."""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from controlplane import ChildMeta, NewEvent, TaskOutcome, TaskSnapshot, TaskStatus
from controlplane.contract import utcnow
from persistence import RetryPolicy, SqlStore
from persistence._schema import NEWEST_TASK_INDEX, SCHEMA_VERSION
from tests.persistence.conftest import new_child, raw_engine
from tests.persistence.test_task_indexes import index_definitions

START = utcnow() - timedelta(hours=1)


def admit(store: SqlStore, child_id: str | None, ms: int, *, task_id: str | None = None) -> str:
    task = TaskSnapshot(
        id=task_id or str(uuid.uuid4()),
        label=f"at {ms} ms",
        owner_session="parent-1",
        status=TaskStatus.RUNNING,
        child_id=child_id,
        runtime_id="runtime-1",
        created_at=START + timedelta(milliseconds=ms),
    )
    store.ledger.admit(task)
    return task.id


def children_with_tasks(store: SqlStore) -> dict[str, str]:
    """Three children with Tasks, one without, a Task of no child; the newest Task id of
    each child that has one."""
    busy, tied, settled = (new_child(store).child_id for _ in range(3))
    new_child(store)  # no Task: no entry
    admit(store, None, 900)  # a Task of no child: never a child's newest
    expected = {}
    for ms in (10, 30, 20):
        last = admit(store, busy, ms)
        if ms == 30:
            expected[busy] = last
    # Two Tasks at the same instant: the greater id is the newer, as in the scan.
    low, high = sorted(str(uuid.uuid4()) for _ in range(2))
    admit(store, tied, 50, task_id=high)
    admit(store, tied, 50, task_id=low)
    expected[tied] = high
    old, new = admit(store, settled, 5), admit(store, settled, 6)
    for task_id in (old, new):
        done = TaskOutcome(status=TaskStatus.COMPLETED, output="done")
        store.ledger.settle((task_id, done, utcnow()))
    expected[settled] = new
    return expected


def children_with_descriptors(store: SqlStore) -> dict[str, tuple[str, str | None]]:
    """A child whose descriptor is sealed (its first turn ended), one whose descriptor is
    an open row; the names each should show."""
    sealed, open_ = new_child(store), new_child(store)
    for meta, descriptor in (
        (sealed, {"version": 1, "provider": "writer", "agent_model": "gpt-x"}),
        (open_, {"version": 1, "provider": "shipper"}),
    ):
        store.append(
            meta.child_id,
            [
                NewEvent(kind="turn/start", turn=1, data={"task_id": "t"}),
                NewEvent(kind="subagent/descriptor", turn=1, data=descriptor),
            ],
        )
    store.append(sealed.child_id, [NewEvent(kind="turn/end", turn=1, data={"status": "completed"})])
    return {sealed.child_id: ("writer", "gpt-x"), open_.child_id: ("shipper", None)}


def newest_ids(store: SqlStore) -> dict[str, str]:
    return {child: task.id for child, task in store.overview.latest_tasks().items()}


def test_each_childs_newest_task_is_read_through_its_index_and_matches_the_scan(
    store_url: str,
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        expected = children_with_tasks(store)

        written = ChildMeta(child_id=str(uuid.uuid4()), parent_session="parent-1", depth=1)
        descriptor = {"version": 1, "provider": "writer", "agent_model": "gpt-x"}
        store.create_child(written, [NewEvent(kind="subagent/descriptor", turn=1, data=descriptor)])
        names = store.overview.names()
        by_index = store.overview.latest_tasks()
        store.overview.newest_by_index(False)
        by_scan = store.overview.latest_tasks()
        statement = store._db.sql.tasks.newest

    assert {child: task.id for child, task in by_index.items()} == expected
    assert by_index == by_scan
    assert names == {written.child_id: ("writer", "gpt-x")}
    assert by_index[next(iter(expected))].status is TaskStatus.RUNNING
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        postgres = conn.dialect.name == "postgresql"
        if postgres:  # its tables are tiny here: make it show what it would use
            conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        explain = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
        plan = [str(row[-1]) for row in conn.exec_driver_sql(explain + statement)]
    engine.dispose()
    assert any(NEWEST_TASK_INDEX in line for line in plan), plan
    if postgres:
        assert not any("Seq Scan on subagent_tasks" in line for line in plan), plan
    else:  # the Tasks are visited by their keys and the child's index, never scanned
        assert not any(line.startswith("SCAN") and "subagent_tasks" in line for line in plan)
        assert not any(line.startswith("SCAN newest") for line in plan), plan


def test_a_version_10_store_gains_the_index_and_read_only_is_read_by_the_scan(
    store_url: str,
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        expected = children_with_tasks(store)
        described = children_with_descriptors(store)
        engine = raw_engine(store_url)
        with engine.begin() as conn:  # as version 10 wrote them: no names in the headers
            conn.execute(sa.text("UPDATE subagent_children SET provider = NULL, model = NULL"))
        engine.dispose()
        assert store.overview.names() == {}
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP INDEX {NEWEST_TASK_INDEX}"))
        for column in ("provider", "model"):
            conn.execute(sa.text(f"ALTER TABLE subagent_children DROP COLUMN {column}"))
        conn.execute(sa.text("UPDATE subagent_schema SET version = 10"))
    engine.dispose()

    with SqlStore(store_url, read_only=True, retry=RetryPolicy.immediate()) as store:
        as_it_is = newest_ids(store)
        headers = store.list_children()
        assert store.overview.names() == {}  # no names kept before version 11
        assert [c.child_id for c in store.overview.children()] == [c.child_id for c in headers]
    assert NEWEST_TASK_INDEX not in index_definitions(store_url)
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        upgraded = newest_ids(store)
        children = {c.child_id for c in store.overview.children()}
        names = store.overview.names()

    assert as_it_is == upgraded == expected
    assert len(children) == 6
    assert names == described
    definition = index_definitions(store_url)[NEWEST_TASK_INDEX]
    assert "child_id, created_at, task_id" in definition, definition
    engine = raw_engine(store_url)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION
