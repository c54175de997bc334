"""The store's schema migrations: creating a new store's tables, or upgrading an existing
store one version at a time to `SCHEMA_VERSION`, and checking a store's version before
reading it as it is.

Each migration is a function of one connection, inside the opener's write transaction;
``_MIGRATIONS[n]`` upgrades version ``n`` to ``n + 1``. A schema change adds one here and
bumps `SCHEMA_VERSION` (`persistence._schema`, where the tables are).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final

from sqlalchemy import insert, inspect, select, text, update
from sqlalchemy.engine import Connection

from controlplane.contract import ErrorCode, SubagentControlError
from persistence._child_names import backfill_child_names
from persistence._schema import (
    ADMISSIONS,
    APPROVALS,
    CHILDREN,
    INBOX,
    NEWEST_TASK_INDEX,
    RUNTIMES,
    SCHEMA_VERSION,
    SEGMENTS,
    SPEND,
    SPEND_NOTICES,
    TASKS,
    add_partial_indexes,
    metadata,
    schema_version_table,
)

__all__ = ["check_schema", "ensure_schema"]

# Any constant works; it only has to be the same in every process that opens the store.
_PG_SCHEMA_LOCK_KEY: Final = 0x5AB_A6E7

Migration = Callable[[Connection], None]


_DROP_LAST_SEQ: Final = f"ALTER TABLE {CHILDREN} DROP COLUMN last_seq"


def _drop_last_seq(conn: Connection) -> None:
    """Version 2: appends no longer bump a ``last_seq`` column in the child's header (an
    extra row write per append); they read the child's highest ``seq`` instead."""
    if conn.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35, 0):
        raise SubagentControlError(
            ErrorCode.STORE_UNAVAILABLE,
            f"upgrading this store needs SQLite 3.35 or newer, which can drop a column; "
            f"this Python has SQLite {sqlite3.sqlite_version}",
        )
    conn.execute(text(_DROP_LAST_SEQ))


def _add_segments(conn: Connection) -> None:
    """Version 3: a turn's events are sealed into one segment row when it ends. Existing
    rows stay as they are until their child's next turn ends."""
    metadata.create_all(conn, tables=[metadata.tables[SEGMENTS]])


def _add_tasks(conn: Connection) -> None:
    """Version 4: Tasks and the runtimes that run them are kept in the store, and a child's
    header carries its claim, and an inbox carries messages forwarded between runtimes."""
    tables = metadata.tables
    metadata.create_all(conn, tables=[tables[RUNTIMES], tables[TASKS], tables[INBOX]])
    present = {column["name"] for column in inspect(conn).get_columns(CHILDREN)}
    for name, statement in _CLAIM_COLUMNS.items():
        if name not in present:
            conn.execute(text(statement))


_CLAIM_COLUMNS: Final = {
    "claim_runtime": f"ALTER TABLE {CHILDREN} ADD COLUMN claim_runtime VARCHAR(64)",
    "claim_task": f"ALTER TABLE {CHILDREN} ADD COLUMN claim_task VARCHAR(64)",
    "fence": f"ALTER TABLE {CHILDREN} ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
}


def _partial_task_indexes(conn: Connection) -> None:
    """Version 5: a Task's admission writes two index entries fewer. The running and the
    pending-notice indexes become partial (only running Tasks, only undrained notices),
    and the index on a Task's child goes (no query used it)."""
    for statement in _DROP_VERSION_4_TASK_INDEXES:
        conn.execute(text(statement))
    for index in metadata.tables[TASKS].indexes:
        if index.name in _VERSION_4_TASK_INDEXES:
            index.create(conn)


_VERSION_4_TASK_INDEXES: Final = (
    "ix_subagent_tasks_notices",
    "ix_subagent_tasks_running",
    "ix_subagent_tasks_child",
)
# Spelled out, not formatted at run time: no SQL here is built from a variable.
_DROP_VERSION_4_TASK_INDEXES: Final = (
    "DROP INDEX IF EXISTS ix_subagent_tasks_notices",
    "DROP INDEX IF EXISTS ix_subagent_tasks_running",
    "DROP INDEX IF EXISTS ix_subagent_tasks_child",
)


def _add_boot_clock(conn: Connection) -> None:
    """Version 6: a runtime's heartbeat is also kept on the host's boot clock (SQLite leases
    are judged on it, not on each process's wall clock). Rows written before it have none: they
    are judged by the wall clock."""
    present = {column["name"] for column in inspect(conn).get_columns(RUNTIMES)}
    if "heartbeat_boot_s" not in present:
        conn.execute(text(_ADD_BOOT_CLOCK))


_ADD_BOOT_CLOCK: Final = f"ALTER TABLE {RUNTIMES} ADD COLUMN heartbeat_boot_s FLOAT"


def _add_task_spend(conn: Connection) -> None:
    """Version 7: a Task row keeps what its turn spent, written with its settlement. Tasks
    settled before have none (they read as spending nothing; their children's events
    still hold it)."""
    present = {column["name"] for column in inspect(conn).get_columns(TASKS)}
    if "spend" not in present:
        conn.execute(text(_ADD_TASK_SPEND))


_ADD_TASK_SPEND: Final = f"ALTER TABLE {TASKS} ADD COLUMN spend TEXT"


def _add_task_recoveries(conn: Connection) -> None:
    """Version 12: a Task row counts how many times its turn was recovered by another
    runtime; Tasks written before it read as never recovered."""
    present = {column["name"] for column in inspect(conn).get_columns(TASKS)}
    if "recoveries" not in present:
        conn.execute(text(_ADD_TASK_RECOVERIES))


_ADD_TASK_RECOVERIES: Final = (
    f"ALTER TABLE {TASKS} ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0"
)


def _add_spend(conn: Connection) -> None:
    """Version 8: budgets. What each scope spent, its budget, and the soft
    notices, in tables of their own; the usage already in transcripts is not counted again
    (it was spent before any budget could hold it)."""
    tables = metadata.tables
    metadata.create_all(conn, tables=[tables[SPEND], tables[SPEND_NOTICES]])


def _add_admissions(conn: Connection) -> None:
    """Version 9: concurrency limits keep their durable FIFO queue (`admissions_table`)."""
    metadata.create_all(conn, tables=[metadata.tables[ADMISSIONS]])


def _add_approvals(conn: Connection) -> None:
    """Version 10: approval requests wait in their own table (`approvals_table`)."""
    metadata.create_all(conn, tables=[metadata.tables[APPROVALS]])


def _add_console_reads(conn: Connection) -> None:
    """Version 11: what a view of every child reads (the console) without a scan or a
    transcript: each child's Tasks by time (`NEWEST_TASK_INDEX`, one seek per child for
    its newest Task), and each child's provider and model in its header, copied from the
    descriptors already stored."""
    for index in metadata.tables[TASKS].indexes:
        if index.name == NEWEST_TASK_INDEX:
            index.create(conn, checkfirst=True)
    present = {column["name"] for column in inspect(conn).get_columns(CHILDREN)}
    for name, statement in _NAME_COLUMNS.items():
        if name not in present:
            conn.execute(text(statement))
    backfill_child_names(conn)


_NAME_COLUMNS: Final = {
    "provider": f"ALTER TABLE {CHILDREN} ADD COLUMN provider TEXT",
    "model": f"ALTER TABLE {CHILDREN} ADD COLUMN model TEXT",
}


_MIGRATIONS: dict[int, Migration] = {
    1: _drop_last_seq,
    2: _add_segments,
    3: _add_tasks,
    4: _partial_task_indexes,
    5: _add_boot_clock,
    6: _add_task_spend,
    7: _add_spend,
    8: _add_admissions,
    9: _add_approvals,
    10: _add_console_reads,
    11: _add_task_recoveries,
}
"""``_MIGRATIONS[n]`` upgrades a version-``n`` store to version ``n + 1``."""


def ensure_schema(conn: Connection) -> None:
    """Create the tables of a new store, or check and migrate an existing one.

    Runs inside the caller's write transaction, so concurrent openers queue up (SQLite's
    write lock; a transaction-scoped advisory lock on PostgreSQL).

    Raises:
        SubagentControlError: ``STORE_UNAVAILABLE`` for a store written by a newer version
            of this code, or with a version this code cannot migrate.
    """
    add_partial_indexes()
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK_KEY})
    found = _stored_version(conn)
    if found is None:
        metadata.create_all(conn)
        conn.execute(insert(schema_version_table).values(id=1, version=SCHEMA_VERSION))
        return
    _refuse_newer(found)
    while found < SCHEMA_VERSION:
        migrate = _MIGRATIONS.get(found)
        if migrate is None:
            raise SubagentControlError(
                ErrorCode.STORE_UNAVAILABLE,
                f"the store has schema version {found}, which this code cannot migrate "
                f"to {SCHEMA_VERSION}",
            )
        migrate(conn)
        found += 1
        conn.execute(update(schema_version_table).values(version=found))


def check_schema(conn: Connection) -> int:
    """The version of an existing store, for reading it as it is: nothing is created or
    migrated (every version so far keeps the columns a read uses; before version 3 there
    are no segments).

    Raises:
        SubagentControlError: ``STORE_NOT_FOUND`` for a database without the store's
            tables; ``STORE_UNAVAILABLE`` for a store written by a newer version of this
            code.
    """
    found = _stored_version(conn)
    if found is None:
        raise SubagentControlError(
            ErrorCode.STORE_NOT_FOUND,
            "this database holds no subagent-control store (no schema version table); "
            "check the URL",
        )
    _refuse_newer(found)
    return found


def _stored_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(schema_version_table.name):
        return None
    version: int | None = conn.execute(select(schema_version_table.c.version)).scalar_one_or_none()
    return version


def _refuse_newer(found: int) -> None:
    if found > SCHEMA_VERSION:
        raise SubagentControlError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the store has schema version {found}, newer than this code reads "
            f"({SCHEMA_VERSION}); upgrade subagent-control to open it",
        )
