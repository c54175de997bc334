"""The store's tables in SQLAlchemy's typed declarative style, and their schema version
(the migrations that reach it are in `persistence._migrations`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from controlplane.contract import (
    ChildMeta,
    ErrorCode,
    SubagentControlError,
)

__all__ = [
    "ADMISSIONS",
    "APPROVALS",
    "CHILDREN",
    "EVENTS",
    "INBOX",
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
    "AdmissionRow",
    "ApprovalRow",
    "Base",
    "ChildRow",
    "EventRow",
    "InboxRow",
    "RuntimeRow",
    "SchemaVersionRow",
    "SegmentRow",
    "SpendNoticeRow",
    "SpendRow",
    "TaskRow",
    "UtcDateTime",
    "sqlite_time",
    "utc_time",
]

SCHEMA_VERSION: Final = 11
"""The version this code writes. Bump it with a migration in `persistence._migrations`."""
SEGMENTS_SINCE: Final = 3
"""The first version with sealed segments: an older store, read as it is, has none."""
SPEND_SINCE: Final = 7
"""The first version whose Task rows keep their spend: an older store, read as it is,
has none (its Tasks read as spending nothing)."""
RECOVERIES_SINCE: Final = 11
"""The first version whose Task rows count their recoveries (SPEC §9): an older store,
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


def utc_time(value: object) -> datetime:
    """A database timestamp as a timezone-aware UTC datetime.

    SQLite returns our fixed-width ISO text; PostgreSQL returns ``timestamptz`` values
    already in UTC (the connection's time zone), which pass through untouched.
    """
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value if value.tzinfo is UTC else value.astimezone(UTC)
    raise TypeError(f"not a stored timestamp: {value!r}")


def sqlite_time(value: datetime) -> str:
    """Fixed-width ISO-8601 text in UTC, so that text order is time order."""
    if value.tzinfo is not UTC:  # an append's own stamp is UTC already (`utcnow`)
        value = value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")


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


Identifier = Annotated[str, mapped_column(String(200))]
BatchId = Annotated[str, mapped_column(String(32))]
JsonText = Annotated[str, mapped_column(Text)]
UtcTime = Annotated[datetime, mapped_column(UtcDateTime())]


class Base(DeclarativeBase):
    """The declarative base of the store's tables."""


class SchemaVersionRow(Base):
    """One row: the schema version the store was last written with."""

    __tablename__ = _VERSION_TABLE

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int]


class ChildRow(Base):
    """A child's durable header, written once.

    An append never rewrites it: the next ``seq`` is one past the child's highest, read
    under a lock that serializes appends per child (SQLite's write lock; on PostgreSQL a
    lock on this row), so ``seq`` stays gapless. ``created_batch`` identifies the
    `create_child` call that wrote the header, so a retry of that call can recognise its
    own earlier, ambiguous commit.
    """

    __tablename__ = CHILDREN

    child_id: Mapped[Identifier] = mapped_column(primary_key=True)
    parent_session: Mapped[Identifier] = mapped_column(index=True)
    depth: Mapped[int]
    seed_length: Mapped[int]
    label: Mapped[str | None] = mapped_column(String(1000))
    created_batch: Mapped[BatchId]
    created_at: Mapped[UtcTime]
    # The claim (SPEC §9): which runtime may write the child's turn, for which Task, under
    # which fencing number. Every append checks it in its transaction; `fence` grows at
    # each new claim, so a runtime that lost its claim can never write again.
    claim_runtime: Mapped[str | None] = mapped_column(String(64))
    claim_task: Mapped[str | None] = mapped_column(String(64))
    fence: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    def to_meta(self) -> ChildMeta:
        """The header as the frozen model callers see."""
        return ChildMeta(
            child_id=self.child_id,
            parent_session=self.parent_session,
            depth=self.depth,
            seed_length=self.seed_length,
            created_at=self.created_at,
            label=self.label,
        )


class EventRow(Base):
    """One transcript event of a turn still open, keyed by (child, seq).

    An append writes one row per event. When a turn ends, its rows are sealed into
    `SegmentRow` s (see there), so this table holds each child's open tail only.

    ``data`` and ``source`` are JSON text. ``batch_id`` is the idempotency key of the
    append that wrote the row: a retry after an ambiguous commit looks for it before
    writing again. It has no index of its own: that lookup runs only on retries and stays
    within the child's rows through the primary key.
    """

    __tablename__ = EVENTS

    child_id: Mapped[Identifier] = mapped_column(
        ForeignKey(f"{CHILDREN}.child_id"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(primary_key=True)
    turn: Mapped[int]
    kind: Mapped[Identifier]
    data: Mapped[JsonText]
    source: Mapped[JsonText | None]
    batch_id: Mapped[BatchId]
    created_at: Mapped[UtcTime]


class SegmentRow(Base):
    """Sealed events: a run of a child's transcript, ``first_seq`` to ``last_seq``, in
    one row.

    The append that writes a ``turn/end`` moves every open row of the child here in the
    same transaction (a few segments for a long turn), so a resume reads one row per turn
    instead of one per event. Nothing about an event changes: ``events`` is a JSON array
    of ``[seq, turn, kind, data, source, created_at]`` holding the stored texts as they
    were (``source`` as its JSON text, ``created_at`` as fixed-width ISO text). Segments
    cover ``seq`` 1 onwards without gaps; a child's open rows follow the last one.
    ``batches`` lists ``[batch_id, first_seq, last_seq]`` of the appends sealed here, so a
    retried append still finds its own earlier, ambiguous commit.
    """

    __tablename__ = SEGMENTS

    child_id: Mapped[Identifier] = mapped_column(
        ForeignKey(f"{CHILDREN}.child_id"), primary_key=True
    )
    first_seq: Mapped[int] = mapped_column(primary_key=True)
    last_seq: Mapped[int]
    events: Mapped[JsonText]
    batches: Mapped[JsonText]


class RuntimeRow(Base):
    """One runtime: an open `SubagentControl` in some process on some host.

    It renews ``heartbeat_at`` every third of ``lease_ttl_s`` (one write per interval per
    process, never per child). It is dead once ``closed_at`` is set or its heartbeat is
    older than its own ``lease_ttl_s``; a live runtime then settles its running Tasks
    ``interrupted``. ``boot_id`` (the kernel's, where there is one) lets a runtime on the
    same host know a dead ``pid`` at once, without waiting out the lease.
    """

    __tablename__ = RUNTIMES

    runtime_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int]
    boot_id: Mapped[str | None] = mapped_column(String(64))
    lease_ttl_s: Mapped[float] = mapped_column(Float)
    started_at: Mapped[UtcTime]
    heartbeat_at: Mapped[UtcTime]
    closed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # SQLite: the heartbeat on the host's boot clock, which no process's wall clock moves
    # (`persistence._host_clock`); NULL on PostgreSQL, which judges by the server's clock.
    heartbeat_boot_s: Mapped[float | None] = mapped_column(Float)


class InboxRow(Base):
    """A message forwarded from one runtime to the runtime that runs its child (SPEC §9).

    ``state`` moves by compare-and-set only: ``pending`` → ``taken`` (the target runtime
    took it) or ``abandoned`` (the sender gave up first, so it is never delivered), then
    ``taken`` → ``answered`` (with ``reply``) or ``abandoned`` (the target died first). A
    ``kill`` row carries a `tasks.kill` of a Task the target runs instead of a message. The
    sender deletes the row once it has its outcome; a live runtime deletes the rows of a
    sender gone for good, and a target the row refused deletes it (`controlplane._expiry`).
    PostgreSQL only; the table exists on
    both backends so a store's schema does not depend on where it was created.
    """

    __tablename__ = INBOX

    inbox_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "send" (a message) or "kill" (a Task)
    child_id: Mapped[Identifier]
    target_runtime: Mapped[str] = mapped_column(String(64))
    sender_runtime: Mapped[str] = mapped_column(String(64))
    parent_session: Mapped[Identifier]
    message: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    reply: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[UtcTime]


RUNNING_TASK: Final = "status = 'running'"
"""A running Task, as the running index's predicate and its queries' (a literal)."""
NOTICE_PENDING: Final = "notice_pending IS NOT NULL"
"""A settled Task whose notice is not drained yet (``notice_pending`` is true or NULL)."""


def _partial_index(name: str, *columns: str, where: str) -> Index:
    return Index(name, *columns, sqlite_where=text(where), postgresql_where=text(where))


class TaskRow(Base):
    """A Task: written when it is admitted, updated once when it settles.

    The settlement is written in the same transaction as the turn's ``turn/end`` when there
    is one, so the transcript and the Task never disagree. ``notice_pending`` is true from
    settlement until the owner drains the Task's completion notice (then NULL), so a drain
    finds its rows through an index and takes each once, in whatever runtime it runs.

    Every index entry is a page written by each admission (a resume's critical path), so
    the running and the pending-notice indexes are partial: they hold the few rows a sweep
    or a drain looks for, not every Task ever run. A query meets them with the same
    predicate as a literal (`RUNNING_TASK`, `NOTICE_PENDING`), which both databases need
    to use a partial index.
    """

    __tablename__ = TASKS
    __table_args__ = (
        Index("ix_subagent_tasks_owner", "owner_session", "created_at"),
        _partial_index("ix_subagent_tasks_notices", "owner_session", where=NOTICE_PENDING),
        _partial_index("ix_subagent_tasks_running", "runtime_id", where=RUNNING_TASK),
    )

    task_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    label: Mapped[str] = mapped_column(String(1000))
    owner_session: Mapped[Identifier]
    child_id: Mapped[str | None] = mapped_column(String(200))
    runtime_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    output: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    code: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[UtcTime]
    settled_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    notice_pending: Mapped[bool | None] = mapped_column(Boolean)
    # What the Task's turn spent (a `Usage`'s stored JSON), written with its settlement
    # (`persistence._turn_usage`); NULL while running, and for nothing spent.
    spend: Mapped[str | None] = mapped_column(Text)
    # How many times another runtime took the running Task over after its own ended
    # (SPEC §9 "Recovery"), grown in the transaction that takes it over.
    recoveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SpendRow(Base):
    """What one scope has spent, and its budget (SPEC §11): a child with its descendants
    (``child:<id>``) or a top-level parent session (``session:<id>``).

    The counters grow by ``UPDATE … SET x = x + n`` (an upsert) in the transaction of the
    append whose events record the spend (`persistence._spend`), for the spending child's
    scope and every scope above it; a gate reads them before each call. ``budget`` is a
    child's budget as JSON (its descriptor's, written with its header, then whatever
    `set_budget` put there; NULL: none). ``warned`` is set, once (a compare-and-set), when
    the spend first passed the soft threshold of a limit: its notice is then written to
    `SpendNoticeRow`.
    """

    __tablename__ = SPEND
    scope: Mapped[str] = mapped_column(String(220), primary_key=True)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    model_calls: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    tool_calls: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    budget: Mapped[str | None] = mapped_column(Text)
    warned: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SpendNoticeRow(Base):
    """A soft budget notice waiting for its owner's drain (`tasks.drain_notices`), taken
    once across every runtime (a DELETE … RETURNING)."""

    __tablename__ = SPEND_NOTICES
    __table_args__ = (Index("ix_subagent_spend_notices_owner", "owner_session"),)

    notice_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_session: Mapped[Identifier]
    task_id: Mapped[str] = mapped_column(String(64))
    child_id: Mapped[str | None] = mapped_column(String(200))
    label: Mapped[str] = mapped_column(String(1000))
    summary: Mapped[str] = mapped_column(Text)
    created_at: Mapped[UtcTime]


class AdmissionRow(Base):
    """One Task's place under one concurrency key (SPEC §11 "Concurrency limits").

    A Task under a limited key has a row per key: ``queued`` while it waits, ``running``
    once it holds the slot. A slot is taken only while the row is ``running`` AND its Task
    still runs (a join, so a Task settled by any means — its turn's end, a sweep of its
    dead runtime, a takeover — frees its slot at once, before the row is deleted). Queue
    order is ``seq`` (FIFO across runtimes). ``plan`` is the JSON a live runtime needs to
    start the Task itself when the runtime holding it died while it was queued (adoption).
    """

    __tablename__ = ADMISSIONS
    __table_args__ = (Index("ix_subagent_admissions_key", "key", "state", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    key: Mapped[str] = mapped_column(String(400))
    state: Mapped[str] = mapped_column(String(16))
    runtime_id: Mapped[str] = mapped_column(String(64))
    child_id: Mapped[Identifier]
    queued_at: Mapped[UtcTime]
    admitted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    plan: Mapped[str] = mapped_column(Text)


class ApprovalRow(Base):
    """An approval request (SPEC §11): a child's tool call waiting for its parent's (or a
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

    __tablename__ = APPROVALS
    __table_args__ = (
        _partial_index(
            "ix_subagent_approvals_notices", "parent_session", where="notice_pending IS NOT NULL"
        ),
        _partial_index("ix_subagent_approvals_waiting", "state", where="state <> 'closed'"),
    )

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    child_id: Mapped[Identifier]
    parent_session: Mapped[Identifier]
    turn: Mapped[int] = mapped_column(Integer)
    call_id: Mapped[str] = mapped_column(String(200))
    tool: Mapped[str] = mapped_column(String(200))
    # The child's provider: only a runtime that has it continues a parked Task.
    provider: Mapped[str] = mapped_column(String(200))
    arguments: Mapped[JsonText]
    reason: Mapped[str | None] = mapped_column(Text)
    pending: Mapped[JsonText]
    parkable: Mapped[bool] = mapped_column(Boolean)
    state: Mapped[str] = mapped_column(String(16))
    allow: Mapped[bool | None] = mapped_column(Boolean)
    note: Mapped[str | None] = mapped_column(Text)
    answer_source: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[UtcTime]
    answered_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    deadline_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    notice_pending: Mapped[bool | None] = mapped_column(Boolean)
