"""The statements of a child's rows: its header and claim (`children_table`), its open
events (`events_table`) and its sealed segments (`segments_table`).

Written once in SQLAlchemy Core and compiled per database by `ChildStatements.build`;
`SqlStore.load`, the append path (`persistence._appends`) and the claims
(`persistence._claims`) run the compiled text on the raw cursor. Every write of a
child's claim (``claim_runtime``, ``claim_task``, ``fence``) is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    LargeBinary,
    Text,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy import cast as sql_cast

from controlplane.contract import ChildMeta
from persistence._dialect import SqlDialect, params
from persistence._schema import children_table, events_table, segments_table

__all__ = [
    "EVENT_INSERT",
    "EVENT_NAMES",
    "ChildStatements",
    "child_table",
    "event_table",
    "header_row",
    "headers",
    "held_claims",
    "provider_names",
]

child_table: Final = children_table
event_table: Final = events_table
segment_table: Final = segments_table

EVENT_NAMES: Final = ("child_id", "seq", "turn", "kind", "data", "source", "batch_id", "created_at")
"""The parameters of an event's INSERT, in order."""
EVENT_INSERT: Final = insert(event_table).values(**params(*EVENT_NAMES))
"""One event's INSERT (`ChildStatements.insert`), which the spend's upsert can ride."""
_SEGMENT_NAMES: Final = ("child_id", "first_seq", "last_seq", "events", "batches")


def header_row(
    meta: ChildMeta,
    batch: str,
    claim: tuple[str, str] | None,
    names: dict[str, str | None],
) -> dict[str, Any]:
    """A new child's header row's values (for ``insert(child_table)``), claimed for its
    first turn by ``claim`` (runtime id, Task id) under fencing number 1, or unclaimed;
    ``names`` are its descriptor's provider and model (`persistence._child_names`)."""
    return {
        "child_id": meta.child_id,
        "parent_session": meta.parent_session,
        "depth": meta.depth,
        "seed_length": meta.seed_length,
        "label": meta.label,
        "created_batch": batch,
        "created_at": meta.created_at,
        "claim_runtime": claim[0] if claim else None,
        "claim_task": claim[1] if claim else None,
        "fence": 1 if claim else 0,
        **names,
    }


SEGMENT_TAIL_CHARS: Final = 2048
"""How much of a child's last segment's text a resume's turn opening reads for its turn."""


def _frame_facts(dialect: SqlDialect, *, segments: bool) -> str:
    """`ChildStatements.frame_facts` for ``dialect`` (a store without segments reads NULL
    for the sealed ones)."""
    ch, ev = child_table.alias("c"), event_table.alias("e")
    child_id: Any = bindparam("child_id")
    tail: Any = literal_column("NULL")
    sealed: Any = literal_column("NULL")
    if segments:
        sg = segment_table.alias("s")
        of_child = sg.c.child_id == ch.c.child_id
        sealed = select(func.max(sg.c.last_seq)).where(of_child).scalar_subquery()
        tail = _one(
            select(dialect.text_tail(sg.c.events, SEGMENT_TAIL_CHARS))
            .where(of_child)
            .order_by(sg.c.first_seq.desc())
        ).scalar_subquery()
    open_rows = (
        select(func.max(ev.c.turn).label("turn"), func.max(ev.c.seq).label("seq"))
        .where(ev.c.child_id == child_id)
        .subquery("o")
    )
    query = (
        select(ch.c.parent_session, open_rows.c.turn, open_rows.c.seq, sealed, tail)
        .select_from(ch)
        .join(open_rows, true())  # one row each: a cross join
        .where(ch.c.child_id == child_id)
    )
    return dialect.compile(query, "child_id", "child_id")


def _one(query: Any) -> Any:
    """``query`` limited to its first row, the limit written in the text (not bound)."""
    return query.limit(literal_column("1")).offset(literal_column("0"))


@dataclass(frozen=True, slots=True)
class ChildStatements:
    """A child's statements, compiled for one database.

    `append` and `load` run these on the pooled DBAPI connection: at a few microseconds
    per statement, SQLAlchemy's per-execution overhead would be most of the cost.
    """

    dialect: SqlDialect
    header: str
    events: str
    """A child's whole transcript in ``seq`` order, in one statement (so one snapshot):
    its sealed segments as ``first_seq, NULL, NULL, events, NULL, NULL`` (a NULL turn
    marks them), merged with its open rows as ``seq, turn, kind, data, source,
    created_at``. Takes the child id `events_binds` times. With ``blob_segments`` a
    segment's ``events`` arrive as bytes (see `build`)."""
    events_binds: int
    load: str
    """`header` and `events` in one statement, so a load is one round trip and one
    snapshot: first the header as ``-1, depth, parent_session, label, seed_length (as
    text), created_at`` (-1 sorts it ahead of every event; the seed length travels as
    text because the column it shares holds sources), then `events`' rows; no row at all
    when the child does not exist. Takes the child id `load_binds` times."""
    load_binds: int
    load_after: str | None
    """`load`, of what was written after an earlier load only: the header, the segments
    that begin after the last ``seq`` that load found sealed (the first may hold events
    it found open) and the open rows after the last ``seq`` it found. Takes the child id
    twice, the sealed ``seq``, the child id, the last ``seq`` (None on a store without
    segments)."""
    exists: str
    lock_child: str | None
    """Serializes appends to one child: its header row's lock (None where the database
    admits one writer at a time, as SQLite does from ``BEGIN IMMEDIATE``)."""
    last_seq: str
    """The child's highest ``seq`` (0 for none), its claim's runtime and its fencing number
    (so an append checks its claim at no extra statement); no row when the child does not
    exist.
    Open rows always follow the last segment, so a segment is consulted only when the
    child has none."""
    insert: str
    insert_next: str | None
    """SQLite: append one event as the child's next ``seq``, if the child's claim is the
    writer's (takes turn, kind, data, source, batch id, created at, child id, runtime,
    fencing number): one autocommit statement where the full append runs four (`BEGIN`,
    the tail read, the INSERT, `COMMIT`), each of which lets the GIL go while the store's
    write lock is held. RETURNING the ``seq`` written; no row when the child is missing or
    its claim is not that (the full append then says which). None on PostgreSQL, where
    the child's row lock comes first."""
    insert_next_unfenced: str | None
    """`insert_next` with no claim check (takes the same but the runtime and the fencing
    number)."""
    landed: str
    """The open rows a batch wrote."""
    open_rows: str
    """A child's open rows, with their batch ids, for sealing."""
    insert_segment: str
    delete_sealed: str
    landed_sealed: str
    """The segments that hold a batch's events, with their batch lists."""
    claim_of: str
    """A child's claim (runtime, Task, fencing number), read under the child's lock."""
    provider_of: str
    """A child's provider, from its header (NULL: none recorded)."""
    claim: str
    """Claim a child (takes runtime, Task id, fencing number, child id)."""
    revoke: str
    """Take a Task's claim away and grow the fencing number (takes child id, Task id)."""
    park: str
    """Park a child's claim: no runtime, its Task kept (takes child id, Task id)."""
    release: str
    """Release a child's claim taken under a fencing number (takes child id, number)."""
    park_held: str
    """Park the claim a runtime holds under a fencing number while its Task waits on an
    approval request (takes child id, runtime, number)."""
    parent: str
    """A child's parent session (takes child id)."""
    claim_task: str
    """The Task a child's claim names (takes child id)."""
    holder: str
    """The runtime a child's claim names (takes child id)."""
    queued_claim: str
    """The fencing number of the claim a queued Task holds in its dead runtime's name
    (takes Task id, dead runtime)."""
    move_queued: str
    """Move the claim of a queued Task from its dead runtime (takes runtime, Task id, dead
    runtime)."""

    frame_facts: str
    """What a resume's turn opening needs (takes child id twice): the child's parent
    session, the highest turn and ``seq`` of its open rows, its last sealed ``seq`` (NULL:
    none) and the end of its last segment's ``events`` text (`SEGMENT_TAIL_CHARS`)."""
    last_segment: str
    """The child's last segment's ``events`` text (takes child id)."""

    @classmethod
    def build(
        cls, dialect: SqlDialect, *, blob_segments: bool = False, segments: bool = True
    ) -> ChildStatements:
        """The statements for ``dialect``.

        ``blob_segments`` (SQLite) reads a segment's ``events`` as a BLOB: the JSON
        decoder takes the stored UTF-8 bytes as they are, where sqlite3 would first
        decode TEXT into a str (measured: 2-3% of a 10,000-message load of ASCII text; a
        third of one whose text is not all ASCII, which orjson would then re-encode).
        ``segments=False`` reads a store written before version 3, which has no
        segments table (the read-only view of an older store; it never writes).
        """
        c, e, s = child_table.c, event_table.c, segment_table.c
        child_id: Any = bindparam("child_id")
        compile_ = dialect.compile
        event_columns = (e.seq, e.turn, e.kind, e.data, e.source, e.created_at)
        open_events = select(*event_columns).where(e.child_id == child_id)
        if segments:
            sealed = select(
                s.first_seq,
                null(),
                literal_column("NULL"),
                sql_cast(s.events, LargeBinary) if blob_segments else s.events,
                literal_column("NULL"),
                literal_column("NULL"),
            ).where(s.child_id == child_id)
            transcript: Any = union_all(sealed, open_events)
        else:
            transcript = open_events
        header_row = select(
            literal_column("-1"),
            c.depth,
            c.parent_session,
            c.label,
            sql_cast(c.seed_length, Text),
            c.created_at,
        ).where(c.child_id == child_id)
        binds = 2 if segments else 1
        events_text = compile_(
            transcript.order_by(literal_column("1")) if segments else open_events.order_by(e.seq),
            *("child_id",) * binds,
        )
        load_parts = (header_row, sealed, open_events) if segments else (header_row, open_events)
        load = union_all(*load_parts).order_by(literal_column("1"))
        load_after = None
        if segments:
            later = (
                sealed.where(s.first_seq > bindparam("sealed")),
                open_events.where(e.seq > bindparam("after")),
            )
            load_after = compile_(
                union_all(header_row, *later).order_by(literal_column("1")),
                "child_id",
                "child_id",
                "sealed",
                "child_id",
                "after",
            )

        by_child = c.child_id == child_id
        if segments:
            ev, sg, ch = event_table.alias("e"), segment_table.alias("s"), child_table.alias("c")
            last_sealed = _one(
                select(sg.c.last_seq)
                .where(sg.c.child_id == ch.c.child_id)
                .order_by(sg.c.first_seq.desc())
            )
            last_seq: Any = select(
                func.coalesce(
                    select(func.max(ev.c.seq))
                    .where(ev.c.child_id == ch.c.child_id)
                    .scalar_subquery(),
                    last_sealed.scalar_subquery(),
                    literal_column("0"),
                ),
                ch.c.claim_runtime,
                ch.c.fence,
            ).where(ch.c.child_id == child_id)
        else:
            ev, ch = event_table.alias("e"), child_table.alias("c")
            last_open = select(func.coalesce(func.max(ev.c.seq), literal_column("0"))).where(
                ev.c.child_id == ch.c.child_id
            )
            last_seq = select(last_open.scalar_subquery()).where(ch.c.child_id == child_id)

        insert_next = insert_next_unfenced = None
        if segments and not dialect.row_locks:
            next_row = select(
                ch.c.child_id,
                last_seq.selected_columns[0] + literal_column("1"),
                *(bindparam(name) for name in EVENT_NAMES[2:]),
            ).where(ch.c.child_id == child_id)
            fenced = next_row.where(
                ch.c.claim_runtime == bindparam("runtime"), ch.c.fence == bindparam("fence")
            )
            next_binds = (*EVENT_NAMES[2:], "child_id")
            insert_next = compile_(
                insert(event_table).from_select(EVENT_NAMES, fenced).returning(event_table.c.seq),
                *next_binds,
                "runtime",
                "fence",
            )
            insert_next_unfenced = compile_(
                insert(event_table).from_select(EVENT_NAMES, next_row).returning(event_table.c.seq),
                *next_binds,
            )

        return cls(
            dialect=dialect,
            header=compile_(
                select(c.parent_session, c.depth, c.seed_length, c.label, c.created_at).where(
                    by_child
                ),
                "child_id",
            ),
            events=events_text,
            events_binds=binds,
            load=compile_(load, *("child_id",) * (binds + 1)),
            load_binds=binds + 1,
            load_after=load_after,
            exists=compile_(select(literal_column("1")).where(by_child), "child_id"),
            lock_child=(
                compile_(dialect.locked(select(literal_column("1")).where(by_child)), "child_id")
                if dialect.row_locks
                else None
            ),
            last_seq=compile_(last_seq, "child_id"),
            insert=compile_(EVENT_INSERT, *EVENT_NAMES),
            insert_next=insert_next,
            insert_next_unfenced=insert_next_unfenced,
            landed=compile_(
                select(*event_columns)
                .where(e.child_id == child_id, e.batch_id == bindparam("batch_id"))
                .order_by(e.seq),
                "child_id",
                "batch_id",
            ),
            open_rows=compile_(
                select(*event_columns, e.batch_id).where(e.child_id == child_id).order_by(e.seq),
                "child_id",
            ),
            insert_segment=compile_(
                insert(segment_table).values(**params(*_SEGMENT_NAMES)), *_SEGMENT_NAMES
            ),
            delete_sealed=compile_(
                delete(event_table).where(e.child_id == child_id, e.seq <= bindparam("upto")),
                "child_id",
                "upto",
            ),
            landed_sealed=compile_(
                select(s.batches, s.events)
                .where(s.child_id == child_id, s.batches.like(bindparam("pattern")))
                .order_by(s.first_seq),
                "child_id",
                "pattern",
            ),
            claim_of=compile_(
                dialect.locked(select(c.claim_runtime, c.claim_task, c.fence).where(by_child)),
                "child_id",
            ),
            provider_of=compile_(select(c.provider).where(by_child), "child_id"),
            claim=compile_(
                update(child_table)
                .values(**params("claim_runtime", "claim_task", "fence"))
                .where(c.child_id == bindparam("child")),
                "claim_runtime",
                "claim_task",
                "fence",
                "child",
            ),
            revoke=compile_(
                update(child_table)
                .values(
                    claim_runtime=null(), claim_task=null(), fence=c.fence + literal_column("1")
                )
                .where(by_child, c.claim_task == bindparam("task_id")),
                "child_id",
                "task_id",
            ),
            park=compile_(
                update(child_table)
                .values(claim_runtime=null(), fence=c.fence + literal_column("1"))
                .where(by_child, c.claim_task == bindparam("task_id")),
                "child_id",
                "task_id",
            ),
            release=compile_(
                update(child_table)
                .values(claim_runtime=null(), claim_task=null())
                .where(by_child, c.fence == bindparam("claimed_fence")),
                "child_id",
                "claimed_fence",
            ),
            park_held=compile_(
                update(child_table)
                .values(claim_runtime=null(), fence=c.fence + literal_column("1"))
                .where(
                    by_child,
                    c.claim_runtime == bindparam("holder"),
                    c.fence == bindparam("claimed_fence"),
                ),
                "child_id",
                "holder",
                "claimed_fence",
            ),
            parent=compile_(select(c.parent_session).where(by_child), "child_id"),
            claim_task=compile_(select(c.claim_task).where(by_child), "child_id"),
            holder=compile_(select(c.claim_runtime).where(by_child), "child_id"),
            queued_claim=compile_(
                select(c.fence).where(
                    c.claim_task == bindparam("task_id"), c.claim_runtime == bindparam("dead")
                ),
                "task_id",
                "dead",
            ),
            move_queued=compile_(
                update(child_table)
                .values(claim_runtime=bindparam("to"), fence=c.fence + literal_column("1"))
                .where(c.claim_task == bindparam("task_id"), c.claim_runtime == bindparam("dead")),
                "to",
                "task_id",
                "dead",
            ),
            frame_facts=_frame_facts(dialect, segments=segments),
            last_segment=compile_(
                _one(select(s.events).where(s.child_id == child_id).order_by(s.first_seq.desc())),
                "child_id",
            ),
        )

    def without_segments(self) -> ChildStatements:
        """These statements for a store written before version 3 (no segments table)."""
        return ChildStatements.build(self.dialect, segments=False)


def held_claims() -> Any:
    """Every claimed child's claim (runtime, child, Task, fencing number), by runtime then
    child: a cold read (the console's, an operator's), built in Core and run through
    SQLAlchemy."""
    c = child_table.c
    return (
        select(c.claim_runtime, c.child_id, c.claim_task, c.fence)
        .where(c.claim_runtime.is_not(None))
        .order_by(c.claim_runtime, c.child_id)
    )


def headers() -> Any:
    """Every child's header fields the console lists, oldest first (a cold read)."""
    c = child_table.c
    return select(
        c.child_id, c.parent_session, c.depth, c.seed_length, c.created_at, c.label
    ).order_by(c.created_at, c.child_id)


def provider_names() -> Any:
    """Every child that names its provider: its id, provider and model (a cold read)."""
    c = child_table.c
    return select(c.child_id, c.provider, c.model).where(c.provider.is_not(None))
