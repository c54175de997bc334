"""The store's tables in SQLAlchemy Core, and their schema version
(the migrations that reach it are in `persistence._migrations`)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.types import TypeEngine

from controlplane.contract import (
    ChildMeta,
    ErrorCode,
    SubagentControlError,
)
from persistence._times import sqlite_time, utc_time

__all__ = [
    "ADMISSIONS",
    "APPROVALS",
    "CHILDREN",
    "EVENTS",
    "INBOX",
    "NEWEST_TASK_INDEX",
    "NEWEST_TASK_SINCE",
    "NOTICE_PENDING",
    "RECOVERIES_SINCE",
    "RUNNING_TASK",
    "RUNTIMES",
    "SCHEMA_VERSION",
    "SEGMENTS",
    "SEGMENTS_SINCE",
    "SPEND",
    "SPEND_NOTICES",
    "SPEND_SINCE",
    "TASKS",
    "UtcDateTime",
    "add_partial_indexes",
    "admissions_table",
    "approvals_table",
    "child_meta",
    "children_table",
    "events_table",
    "inbox_table",
    "metadata",
    "runtimes_table",
    "schema_version_table",
    "segments_table",
    "spend_notices_table",
    "spend_table",
    "sqlite_time",
    "tasks_table",
    "utc_time",
]

SCHEMA_VERSION: Final = 12
"""The version this code writes. Bump it with a migration in `persistence._migrations`."""
SEGMENTS_SINCE: Final = 3
"""The first version with sealed segments: an older store, read as it is, has none."""
SPEND_SINCE: Final = 7
"""The first version whose Task rows keep their spend: an older store, read as it is,
has none (its Tasks read as spending nothing)."""
NEWEST_TASK_SINCE: Final = 11
"""The first version with `NEWEST_TASK_INDEX` and each child's provider and model in its
header: an older store, read as it is, is scanned, and its children show none."""
NEWEST_TASK_INDEX: Final = "ix_subagent_tasks_newest"
"""Each child's Tasks by time: a child's newest Task, and its Tasks newest first, are read
from it (the console)."""
RECOVERIES_SINCE: Final = 12
"""The first version whose Task rows count their recoveries: an older store,
read as it is, has none (its Tasks read as never recovered)."""

CHILDREN: Final = "subagent_children"
EVENTS: Final = "subagent_events"
SEGMENTS: Final = "subagent_segments"
RUNTIMES: Final = "subagent_runtimes"
TASKS: Final = "subagent_tasks"
INBOX: Final = "subagent_inbox"
SPEND: Final = "subagent_spend"
SPEND_NOTICES: Final = "subagent_spend_notices"
ADMISSIONS: Final = "subagent_admissions"
APPROVALS: Final = "subagent_approvals"
_VERSION_TABLE: Final = "subagent_schema"


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on both backends.

    PostgreSQL keeps ``timestamptz``. SQLite has no time type: it stores fixed-width
    ISO-8601 text (``2024-05-01T12:00:00.000000+00:00``) that sorts chronologically.
    Naive datetimes are refused: their time zone is a guess.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(32))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"timestamp {value!r} has no time zone; pass UTC"
            )
        return sqlite_time(value) if dialect.name == "sqlite" else value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else utc_time(value)


def _id(name: str, *, primary_key: bool = False, nullable: bool = False) -> Column[str]:
    """A caller's identifier (a child id, a session)."""
    return Column(name, String(200), primary_key=primary_key, nullable=nullable)


def _key(name: str, *, nullable: bool = False) -> Column[str]:
    """One of our own ids (a runtime, a Task, a request)."""
    return Column(name, String(64), nullable=nullable)


def _json(name: str, *, nullable: bool = False) -> Column[str]:
    return Column(name, Text, nullable=nullable)


def _time(name: str, *, nullable: bool = False) -> Column[datetime]:
    return Column(name, UtcDateTime(), nullable=nullable)


def _counter(name: str, kind: type[Integer] | type[Float[float]] = BigInteger) -> Column[Any]:
    return Column(name, kind, nullable=False, default=0, server_default="0")


metadata: Final = MetaData()
"""The store's tables, in SQLAlchemy Core. Not the ORM's declarative classes: nothing
here wants an object per row, and importing the ORM cost every command-line call about
280 ms before it printed anything."""

schema_version_table: Final = Table(
    _VERSION_TABLE,
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)
"""One row: the schema version the store was last written with."""

children_table: Final = Table(
    CHILDREN,
    metadata,
    _id("child_id", primary_key=True),
    Column("parent_session", String(200), nullable=False, index=True),
    Column("depth", Integer, nullable=False),
    Column("seed_length", Integer, nullable=False),
    Column("label", String(1000)),
    Column("created_batch", String(32), nullable=False),
    _time("created_at"),
    # The claim: which runtime may write the child's turn, for which Task, under
    # which fencing number. Every append checks it in its transaction; `fence` grows at
    # each new claim, so a runtime that lost its claim can never write again.
    _key("claim_runtime", nullable=True),
    _key("claim_task", nullable=True),
    _counter("fence", Integer),
    # Its descriptor's provider and model selector (``agent_model``), copied from the
    # descriptor event its header is written with, so a view of every child reads them
    # without a transcript (the console). NULL: no descriptor, or no model named.
    Column("provider", Text),
    Column("model", Text),
)
"""A child's durable header, written once.

An append never rewrites it: the next ``seq`` is one past the child's highest, read
under a lock that serializes appends per child (SQLite's write lock; on PostgreSQL a
lock on this row), so ``seq`` stays gapless. ``created_batch`` identifies the
`create_child` call that wrote the header, so a retry of that call can recognise its
own earlier, ambiguous commit.
"""

events_table: Final = Table(
    EVENTS,
    metadata,
    Column("child_id", String(200), ForeignKey(f"{CHILDREN}.child_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("turn", Integer, nullable=False),
    Column("kind", String(200), nullable=False),
    _json("data"),
    _json("source", nullable=True),
    Column("batch_id", String(32), nullable=False),
    _time("created_at"),
)
"""One transcript event of a turn still open, keyed by (child, seq).

An append writes one row per event. When a turn ends, its rows are sealed into
segments (see `segments_table`), so this table holds each child's open tail only.

``data`` and ``source`` are JSON text. ``batch_id`` is the idempotency key of the
append that wrote the row: a retry after an ambiguous commit looks for it before
writing again. It has no index of its own: that lookup runs only on retries and stays
within the child's rows through the primary key.
"""

segments_table: Final = Table(
    SEGMENTS,
    metadata,
    Column("child_id", String(200), ForeignKey(f"{CHILDREN}.child_id"), primary_key=True),
    Column("first_seq", Integer, primary_key=True),
    Column("last_seq", Integer, nullable=False),
    _json("events"),
    _json("batches"),
)
"""Sealed events: a run of a child's transcript, ``first_seq`` to ``last_seq``, in one
row.

The append that writes a ``turn/end`` moves every open row of the child here in the
same transaction (a few segments for a long turn), so a resume reads one row per turn
instead of one per event. Nothing about an event changes: ``events`` is a JSON array
of ``[seq, turn, kind, data, source, created_at]`` holding the stored texts as they
were (``source`` as its JSON text, ``created_at`` as fixed-width ISO text). Segments
cover ``seq`` 1 onwards without gaps; a child's open rows follow the last one.
``batches`` lists ``[batch_id, first_seq, last_seq]`` of the appends sealed here, so a
retried append still finds its own earlier, ambiguous commit.
"""

runtimes_table: Final = Table(
    RUNTIMES,
    metadata,
    Column("runtime_id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    _key("boot_id", nullable=True),
    Column("lease_ttl_s", Float, nullable=False),
    _time("started_at"),
    _time("heartbeat_at"),
    _time("closed_at", nullable=True),
    # SQLite: the heartbeat on the host's boot clock, which no process's wall clock moves
    # (`persistence._host_clock`); NULL on PostgreSQL, which judges by the server's clock.
    Column("heartbeat_boot_s", Float),
)
"""One runtime: an open `SubagentControl` in some process on some host.

It renews ``heartbeat_at`` every third of ``lease_ttl_s`` (one write per interval per
process, never per child). It is dead once ``closed_at`` is set or its heartbeat is
older than its own ``lease_ttl_s``; a live runtime then settles its running Tasks
``interrupted``. ``boot_id`` (the kernel's, where there is one) lets a runtime on the
same host know a dead ``pid`` at once, without waiting out the lease.
"""

inbox_table: Final = Table(
    INBOX,
    metadata,
    Column("inbox_id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),  # "send" (a message) or "kill" (a Task)
    _id("child_id"),
    _key("target_runtime"),
    _key("sender_runtime"),
    _id("parent_session"),
    _json("message"),
    _json("source"),
    Column("state", String(16), nullable=False),
    _json("reply", nullable=True),
    _time("created_at"),
)
"""A message forwarded from one runtime to the runtime that runs its child.

``state`` moves by compare-and-set only: ``pending`` → ``taken`` (the target runtime
took it) or ``abandoned`` (the sender gave up first, so it is never delivered), then
``taken`` → ``answered`` (with ``reply``) or ``abandoned`` (the target died first). A
``kill`` row carries a `tasks.kill` of a Task the target runs instead of a message. The
sender deletes the row once it has its outcome; a live runtime deletes the rows of a
sender gone for good, and a target the row refused deletes it
(`controlplane.runtime.lease._expiry`). PostgreSQL only; the table exists on both backends so a
store's schema does not depend on where it was created.
"""


RUNNING_TASK: Final = "status = 'running'"
"""A running Task, as the running index's predicate and its queries' (a literal)."""
NOTICE_PENDING: Final = "notice_pending IS NOT NULL"
"""A settled Task whose notice is not drained yet (``notice_pending`` is true or NULL)."""


tasks_table: Final = Table(
    TASKS,
    metadata,
    Column("task_id", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("label", String(1000), nullable=False),
    _id("owner_session"),
    _id("child_id", nullable=True),
    _key("runtime_id"),
    Column("status", String(16), nullable=False),
    _json("output", nullable=True),
    _json("detail", nullable=True),
    Column("code", String(40)),
    _time("created_at"),
    _time("settled_at", nullable=True),
    Column("notice_pending", Boolean),
    # What the Task's turn spent (a `Usage`'s stored JSON), written with its settlement
    # (`persistence._turn_usage`); NULL while running, and for nothing spent.
    _json("spend", nullable=True),
    # How many times another runtime took the running Task over after its own ended
    # (a recovery), grown in the transaction that takes it over.
    _counter("recoveries", Integer),
    Index("ix_subagent_tasks_owner", "owner_session", "created_at"),
    Index(NEWEST_TASK_INDEX, "child_id", "created_at", "task_id"),
)
"""A Task: written when it is admitted, updated once when it settles.

The settlement is written in the same transaction as the turn's ``turn/end`` when there
is one, so the transcript and the Task never disagree. ``notice_pending`` is true from
settlement until the owner drains the Task's completion notice (then NULL), so a drain
finds its rows through an index and takes each once, in whatever runtime it runs.

Every index entry is a page written by each admission (a resume's critical path), so
the running and the pending-notice indexes are partial: they hold the few rows a sweep
or a drain looks for, not every Task ever run. A query meets them with the same
predicate as a literal (`RUNNING_TASK`, `NOTICE_PENDING`), which both databases need
to use a partial index. The child's index (`NEWEST_TASK_INDEX`) holds every Task: the
console's overview reads each child's newest Task through it (one seek per child
instead of a scan of every Task ever run), for an admission cost measured in
docs/benchmarks.md#console.
"""

spend_table: Final = Table(
    SPEND,
    metadata,
    Column("scope", String(220), primary_key=True),
    _counter("tokens"),
    _counter("cost", Float),
    _counter("model_calls"),
    _counter("tool_calls"),
    _counter("seconds", Float),
    _json("budget", nullable=True),
    _counter("warned", Integer),
)
"""What one scope has spent, and its budget: a child with its descendants
(``child:<id>``) or a top-level parent session (``session:<id>``).

The counters grow by ``UPDATE … SET x = x + n`` (an upsert) in the transaction of the
append whose events record the spend (`persistence._spend`), for the spending child's
scope and every scope above it; a gate reads them before each call. ``budget`` is a
child's budget as JSON (its descriptor's, written with its header, then whatever
`set_budget` put there; NULL: none). ``warned`` is set, once (a compare-and-set), when
the spend first passed the soft threshold of a limit: its notice is then written to
`spend_notices_table`.
"""

spend_notices_table: Final = Table(
    SPEND_NOTICES,
    metadata,
    Column("notice_id", String(64), primary_key=True),
    _id("owner_session"),
    _key("task_id"),
    _id("child_id", nullable=True),
    Column("label", String(1000), nullable=False),
    _json("summary"),
    _time("created_at"),
    Index("ix_subagent_spend_notices_owner", "owner_session"),
)
"""A soft budget notice waiting for its owner's drain (`tasks.drain_notices`), taken
once across every runtime (a DELETE … RETURNING)."""

admissions_table: Final = Table(
    ADMISSIONS,
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("task_id", String(64), nullable=False, index=True),
    Column("key", String(400), nullable=False),
    Column("state", String(16), nullable=False),
    _key("runtime_id"),
    _id("child_id"),
    _time("queued_at"),
    _time("admitted_at", nullable=True),
    _json("plan"),
    Index("ix_subagent_admissions_key", "key", "state", "seq"),
)
"""One Task's place under one concurrency key (a concurrency limit).

A Task under a limited key has a row per key: ``queued`` while it waits, ``running``
once it holds the slot. A slot is taken only while the row is ``running`` AND its Task
still runs (a join, so a Task settled by any means — its turn's end, a sweep of its
dead runtime, a takeover — frees its slot at once, before the row is deleted). Queue
order is ``seq`` (FIFO across runtimes). ``plan`` is the JSON a live runtime needs to
start the Task itself when the runtime holding it died while it was queued (adoption).
"""

approvals_table: Final = Table(
    APPROVALS,
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("task_id", String(64), nullable=False, index=True),
    _id("child_id"),
    _id("parent_session"),
    Column("turn", Integer, nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("tool", String(200), nullable=False),
    # The child's provider: only a runtime that has it continues a parked Task.
    Column("provider", String(200), nullable=False),
    _json("arguments"),
    _json("reason", nullable=True),
    _json("pending"),
    Column("parkable", Boolean, nullable=False),
    Column("state", String(16), nullable=False),
    Column("allow", Boolean),
    _json("note", nullable=True),
    _json("answer_source", nullable=True),
    _time("created_at"),
    _time("answered_at", nullable=True),
    _time("deadline_at", nullable=True),
    Column("notice_pending", Boolean),
)
"""An approval request: a child's tool call waiting for its parent's (or a
person's) answer.

Written in the transaction of its ``approval/request`` event, with its Task turned
``input_required``. ``state`` goes ``open`` → ``answered`` (a compare-and-set: one
answer, whoever sends it) → ``closed`` (the run took the answer, in the transaction of
its ``approval/answer`` event, and its Task reads ``running`` again). A request whose
Task settled first is closed whatever its row says: an answer to it is refused. While
a request waits, the child's claim either stays with the runtime whose run waits, or
is parked: no runtime, the claim's Task this one (`persistence._approvals`).
``notice_pending`` is true until the parent drains the request's notice (then NULL).
``pending`` holds the calls of the same reply still to run after this one.
"""


_PARTIAL_INDEXES: Final = (
    (tasks_table, "ix_subagent_tasks_notices", "owner_session", NOTICE_PENDING),
    (tasks_table, "ix_subagent_tasks_running", "runtime_id", RUNNING_TASK),
    (approvals_table, "ix_subagent_approvals_notices", "parent_session", NOTICE_PENDING),
    (approvals_table, "ix_subagent_approvals_waiting", "state", "state <> 'closed'"),
)
_partial_lock = threading.Lock()


def add_partial_indexes() -> None:
    """Give the tables their partial indexes, before any DDL runs (idempotent).

    Kept off the table definitions: a ``sqlite_where``/``postgresql_where`` option makes
    SQLAlchemy import both dialects to check its name (~90 ms), which a process that only
    reads a store (the command line) never needs. Creating or migrating a schema calls
    this first.
    """
    with _partial_lock:
        for table, name, column, where in _PARTIAL_INDEXES:
            if not any(index.name == name for index in table.indexes):
                predicate = text(where)
                Index(name, table.c[column], sqlite_where=predicate, postgresql_where=predicate)


def child_meta(row: Any) -> ChildMeta:
    """A `children_table` row as the frozen model callers see."""
    return ChildMeta(
        child_id=row.child_id,
        parent_session=row.parent_session,
        depth=row.depth,
        seed_length=row.seed_length,
        created_at=row.created_at,
        label=row.label,
    )
