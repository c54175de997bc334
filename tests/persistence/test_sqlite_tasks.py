"""The command line's read of a SQLite store's Tasks with `sqlite3` alone
(`persistence.sqlite_recent_tasks`): its statements are SQLAlchemy's, it reads what the
store reads, and it leaves to the store every case it does not serve."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import bindparam, select
from sqlalchemy.dialects import sqlite

from controlplane import SubagentControl
from controlplane.contract import TaskStatus, utcnow
from persistence import SqlStore, sqlite_recent_tasks
from persistence._schema import SCHEMA_VERSION, schema_version_table, sqlite_time, tasks_table
from persistence._sqlite_tasks import (
    READS_VERSION,
    SCHEMA_VERSION_READ,
    TASKS_OF_OWNER,
    TASKS_RECENT,
)
from persistence._task_snapshots import TASK_COLUMNS
from tests.fakes import FakeProvider
from tests.support import idle_child

_T = tasks_table.c


def _compiled(statement: object) -> str:
    return str(statement.compile(dialect=sqlite.dialect()))  # type: ignore[attr-defined]


def test_its_statements_are_what_sqlalchemy_compiles_for_the_current_schema() -> None:
    recent = select(*(_T[name] for name in TASK_COLUMNS)).order_by(
        _T.created_at.desc(), _T.task_id.desc()
    )
    assert _compiled(recent) == TASKS_RECENT
    assert _compiled(recent.where(_T.owner_session == bindparam("owner"))) == TASKS_OF_OWNER
    assert _compiled(select(schema_version_table.c.version)) == SCHEMA_VERSION_READ
    assert READS_VERSION == SCHEMA_VERSION


def _add_task(path: Path, task_id: str, status: str, **columns: object) -> None:
    row = {
        "task_id": task_id, "kind": "subagent", "label": f"label {task_id}",
        "owner_session": "parent-1", "child_id": None, "runtime_id": "", "status": status,
        "created_at": sqlite_time(utcnow()), "recoveries": 0, **columns,
    }  # fmt: skip
    with sqlite3.connect(path) as conn:
        conn.execute(
            f"INSERT INTO subagent_tasks ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            tuple(row.values()),
        )
    conn.close()


def test_it_reads_the_tasks_as_the_store_does(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    url = f"sqlite:///{path}"
    with SubagentControl.open(url) as control:
        control.providers.register(FakeProvider())
        idle_child(control, control.agents.register("parent-1"))
        idle_child(control, control.agents.register("parent-2"))
    spend = json.dumps({"input_tokens": 7, "output_tokens": 3, "model_calls": 1, "cost": 0.5})
    _add_task(
        path, "failed-1", "failed", code="BUDGET_EXHAUSTED", detail="token budget reached",
        settled_at=sqlite_time(utcnow()), spend=spend,
    )  # fmt: skip
    _add_task(path, "running-1", "running", runtime_id="rt-1", recoveries=2)
    with SqlStore(url, read_only=True) as store:
        for owner in (None, "parent-1", "parent-2", "nobody"):
            assert sqlite_recent_tasks(str(path), owner) == store.ledger.recent(owner)
    read = sqlite_recent_tasks(str(path))
    assert read is not None
    assert len(read) == 4
    failed = next(task for task in read if task.id == "failed-1")
    assert failed.usage.total_tokens == 10
    assert failed.outcome is not None
    assert failed.outcome.code is not None


@pytest.mark.parametrize("status", ["queued", "input_required"])
def test_a_task_that_shows_more_than_its_row_is_left_to_the_store(
    tmp_path: Path, status: str
) -> None:
    path = tmp_path / "state.db"
    SqlStore(f"sqlite:///{path}").close()
    _add_task(path, "t-1", "completed", settled_at=sqlite_time(utcnow()))
    assert sqlite_recent_tasks(str(path)) is not None
    _add_task(path, "t-2", status)
    assert TaskStatus(status) in (TaskStatus.QUEUED, TaskStatus.INPUT_REQUIRED)
    assert sqlite_recent_tasks(str(path)) is None


def test_a_store_of_another_version_or_no_store_is_left_to_the_store(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqlStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE subagent_schema SET version = version - 1")
    conn.close()
    assert sqlite_recent_tasks(str(path)) is None  # older: read as it is, by the store
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert sqlite_recent_tasks(str(empty)) is None
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    assert sqlite_recent_tasks(str(garbage)) is None
    assert sqlite_recent_tasks(str(tmp_path / "missing.db")) is None
