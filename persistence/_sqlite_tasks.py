"""The Tasks of a SQLite store, read with `sqlite3` alone: what ``subagent-control tasks``
prints, without SQLAlchemy or the store's tables.

Opening a `SqlStore` loads SQLAlchemy Core, the table definitions and the compile of
their statements: most of what the command took before it printed anything. This read
needs none of them: its statements are written out here, for the current schema only, and
`tests/persistence/test_sqlite_tasks.py` checks each against what SQLAlchemy compiles from
the tables (and `READS_VERSION` against the schema's version), so they cannot drift apart.
Anything this read does not serve is left to the store (`sqlite_recent_tasks` answers None): a
store of another version (an older one read as it is, or a newer one to refuse), a
database it cannot open read-only or that holds no store, and the Tasks whose rows need
another table to show (queued ones, with their queue place; ones waiting for an answer,
with their approval request).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Final
from urllib.parse import quote

from controlplane.contract import TaskSnapshot, TaskStatus
from persistence._task_snapshots import snapshot_of_columns

__all__ = [
    "READS_VERSION",
    "SCHEMA_VERSION_READ",
    "TASKS_OF_OWNER",
    "TASKS_RECENT",
    "sqlite_recent_tasks",
]

READS_VERSION: Final = 12
"""The schema version these statements read (the store's current one)."""

SCHEMA_VERSION_READ: Final = "SELECT subagent_schema.version \nFROM subagent_schema"
TASKS_RECENT: Final = (
    "SELECT subagent_tasks.task_id, subagent_tasks.label, "
    "subagent_tasks.owner_session, subagent_tasks.child_id, "
    "subagent_tasks.runtime_id, subagent_tasks.status, subagent_tasks.output, "
    "subagent_tasks.detail, subagent_tasks.code, subagent_tasks.created_at, "
    "subagent_tasks.settled_at, subagent_tasks.spend, subagent_tasks.recoveries "
    "\nFROM subagent_tasks ORDER BY subagent_tasks.created_at DESC, "
    "subagent_tasks.task_id DESC"
)
"""Every Task, newest first (`TaskLedger.recent`), its columns
`persistence._task_snapshots.TASK_COLUMNS`."""
TASKS_OF_OWNER: Final = (
    "SELECT subagent_tasks.task_id, subagent_tasks.label, "
    "subagent_tasks.owner_session, subagent_tasks.child_id, "
    "subagent_tasks.runtime_id, subagent_tasks.status, subagent_tasks.output, "
    "subagent_tasks.detail, subagent_tasks.code, subagent_tasks.created_at, "
    "subagent_tasks.settled_at, subagent_tasks.spend, subagent_tasks.recoveries "
    "\nFROM subagent_tasks \nWHERE subagent_tasks.owner_session = ? ORDER BY "
    "subagent_tasks.created_at DESC, subagent_tasks.task_id DESC"
)
"""The same, of one owner session."""

_ELSEWHERE: Final = frozenset((TaskStatus.QUEUED, TaskStatus.INPUT_REQUIRED))
"""Statuses whose Tasks show more than their row (a queue place, an approval request)."""
_BUSY_S: Final = 5.0


def sqlite_recent_tasks(path: str, owner_session: str | None = None) -> list[TaskSnapshot] | None:
    """The Tasks of the SQLite store in file ``path`` (of ``owner_session`` when given),
    newest first, as `TaskLedger.recent` reads them; None when this read does not serve
    them (see the module docstring): the caller then opens the store."""
    try:
        conn = sqlite3.connect(
            f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=_BUSY_S
        )
    except sqlite3.Error:
        return None
    try:
        row = conn.execute(SCHEMA_VERSION_READ).fetchone()
        if row is None or row[0] != READS_VERSION:
            return None
        if owner_session is None:
            rows = conn.execute(TASKS_RECENT).fetchall()
        else:
            rows = conn.execute(TASKS_OF_OWNER, (owner_session,)).fetchall()
    except sqlite3.Error:
        return None  # no store here, or not one this read knows: the store says which
    finally:
        conn.close()
    tasks = [snapshot_of_columns(*row) for row in rows]
    if any(task.status in _ELSEWHERE for task in tasks):
        return None
    return tasks
