"""Writing a child's transcript: its creation and its appends, one attempt each.

Every write runs under the child's lock (PostgreSQL: its header row; SQLite: the write
transaction): the tail read (`Appends.tail`) hands out ``seq`` and checks the writer's
claim at no extra statement, the ``turn/end`` append seals the turn's open rows into a
segment, and a retried attempt first looks for an earlier attempt's rows by its batch id
(`Appends.landed`), so a commit whose acknowledgement was lost is never applied twice.
`SqlStore` validates and retries; `persistence._claims.Claims` shares the tail and the
seal when it closes a dead runtime's open turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import (
    ChildMeta,
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControlError,
)
from persistence._child_names import descriptor_names
from persistence._children_sql import header_row
from persistence._codec import PendingEvent, SteeringRecord, decode_events, stored_events
from persistence._schema import children_table, events_table
from persistence._segments import batch_range, decode_segment
from persistence._segments import seal as seal_rows
from persistence._task_sql import Fence, Settlement, TxStep, settle_params
from persistence._turn_usage import turn_usage, usage_column

if TYPE_CHECKING:
    from persistence._inbox import WakeUp
    from persistence._port import StorePort

__all__ = ["Appends", "not_found"]


class Appends:
    """`SqlStore`'s write path (kept apart so the store module stays readable): the store
    runs `create` and `append` under its retry policy."""

    def __init__(self, port: StorePort) -> None:
        self._s = port

    def create(
        self,
        meta: ChildMeta,
        pending: list[PendingEvent],
        batch: str,
        created_at: datetime,
        attempt: int,
        claim: tuple[str, str] | None = None,
    ) -> list[SessionEvent]:
        try:
            with self._s.db.connection(write=True) as conn:
                conn.execute(
                    insert(children_table),
                    header_row(meta, batch, claim, descriptor_names(pending)),
                )
                if pending:  # after the header: the events' foreign key needs it
                    self._created_spend(conn, meta, pending)
                    conn.execute(
                        insert(events_table),
                        [
                            {
                                "child_id": meta.child_id,
                                "seq": seq,
                                "turn": p.turn,
                                "kind": p.kind,
                                "data": p.data_json,
                                "source": p.source_json,
                                "batch_id": batch,
                                "created_at": created_at,
                            }
                            for seq, p in enumerate(pending, start=1)
                        ],
                    )
        except sa_exc.IntegrityError as exc:
            if attempt > 1:  # perhaps our own earlier attempt, whose commit went unheard
                landed = self.created_by(meta.child_id, batch)
                if landed is not None:
                    return landed
            raise SubagentControlError(
                ErrorCode.CHILD_EXISTS,
                f"child {meta.child_id} already exists; a child id is used once",
                child_id=meta.child_id,
            ) from exc
        self._s.committed()
        return stored_events(pending, 1, created_at)

    def _created_spend(
        self, conn: Connection, meta: ChildMeta, pending: list[PendingEvent]
    ) -> None:
        """A new child's budget and what its first events spent, in its creation's
        transaction (its seed is its parent's history: spent by the parent, not counted)."""
        spend = self._s.spend
        cursor = spend.on_connection(conn)
        spend.created(cursor, meta.child_id, pending)
        spend.add(cursor, meta.child_id, pending[meta.seed_length :])

    def created_by(self, child_id: str, batch: str) -> list[SessionEvent] | None:
        """The events ``create_child`` call ``batch`` wrote, or None if it wrote nothing."""
        query = select(children_table.c.created_batch).where(children_table.c.child_id == child_id)
        with self._s.db.connection(write=False) as conn:
            created_batch = conn.execute(query).scalar_one_or_none()
        if created_batch != batch:
            return None
        with self._s.db.cursor(write=False) as cursor:
            return self.landed(cursor, child_id, batch)

    def append(
        self,
        child_id: str,
        pending: list[PendingEvent],
        batch: str,
        created_at: datetime,
        attempt: int,
        settle: Settlement | None = None,
        fence: Fence | None = None,
        answer_steered: Sequence[tuple[str, str]] = (),
        seconds: float = 0.0,
        also: TxStep | None = None,
    ) -> list[SessionEvent]:
        store = self._s
        statements = store.sql
        sql, tasks = statements.children, statements.tasks
        if (
            attempt == 1
            and sql.insert_next is not None
            and len(pending) == 1
            and settle is None
            and not answer_steered
            and also is None
            and not seconds
            and (
                pending[0].__class__ is SteeringRecord  # its text only: nothing spent
                or (
                    pending[0].kind != EventKind.TURN_END and not store.spend.records_spend(pending)
                )
            )
        ):
            # A steer's record, a message: one statement, nothing else in its transaction.
            first = self._append_next(child_id, pending[0], batch, created_at, fence)
            if first is not None:
                return stored_events(pending, first, created_at)
            # Not written (missing, or not its claim): the full append below says which.
        wakeups: list[WakeUp] = []  # of forwarded steers' senders, sent once committed
        # A transaction that does not commit makes the spend ledger forget what its
        # counting worked out from it, before the next writer comes in.
        with store.db.cursor(write=True, abandoned=store.spend.abandoned) as cursor:
            # First, under the child's lock: an earlier attempt whose commit is still in
            # flight then finishes before the retry below looks for its rows.
            last, holder, number = self.tail(cursor, child_id)
            if attempt > 1:
                landed = self.landed(cursor, child_id, batch)
                if landed:  # before the claim check: a landed turn end released the claim
                    return landed
            if fence is not None and (holder, number) != fence:
                raise _fenced(child_id, fence, holder)
            first = last + 1
            stamp = store.stamp(created_at)
            # Forwarded steers' answers commit with their records, together or not at all.
            inbox = store.inbox if answer_steered else None  # there: `append` checked
            counted = False  # the spend, by the statement that inserted its event
            if len(pending) == 1:  # a steer's record, a message: the common case, kept lean
                p = pending[0]
                row = (child_id, first, p.turn, p.kind, p.data_json, p.source_json, batch, stamp)
                if inbox is not None and len(answer_steered) == 1:
                    # One record and its answer: one statement for both.
                    wakeups = inbox.insert_answering(cursor, row, answer_steered[0])
                else:
                    counted = store.spend.insert_counting(cursor, child_id, p, row, seconds)
                    if not counted:
                        cursor.execute(sql.insert, row)  # execute costs less than executemany
                    if inbox is not None:
                        wakeups = inbox.answer_steered(cursor, answer_steered)
                ends_turn = p.kind == EventKind.TURN_END
            else:
                cursor.executemany(
                    sql.insert,
                    [
                        (child_id, seq, p.turn, p.kind, p.data_json, p.source_json, batch, stamp)
                        for seq, p in enumerate(pending, start=first)
                    ],
                )
                if inbox is not None:
                    wakeups = inbox.answer_steered(cursor, answer_steered)
                ends_turn = any(p.kind == EventKind.TURN_END for p in pending)
            # What these events spent, counted for the child and every scope above it in
            # this same transaction (nothing when they record no usage).
            if not counted:
                store.spend.add(cursor, child_id, pending, seconds=seconds, kept_writer=True)
            if also is not None:
                also(cursor)
            sealed = self.seal(cursor, child_id) if ends_turn else None
            if settle is not None:
                # The Task's spend, summed from the rows its turn's end just sealed (read
                # for the seal anyway), goes in with its settlement.
                if sealed is None:
                    cursor.execute(sql.open_rows, (child_id,))
                    sealed = list(cursor.fetchall())
                spend = usage_column(turn_usage(sealed, pending[-1].turn))
                cursor.execute(tasks.settle, settle_params(settle, store.stamp(settle[2]), spend))
                if fence is not None:  # the turn is over: the claim goes with it
                    cursor.execute(sql.release, (child_id, fence[1]))
        store.committed()
        store.spend.published(cursor)  # the counters its upsert returned: the gate's view
        if wakeups and store.inbox is not None:
            store.inbox.wake(wakeups)  # outside the write: see `persistence._inbox`
        return stored_events(pending, first, created_at)

    def _append_next(
        self,
        child_id: str,
        p: PendingEvent,
        batch: str,
        created_at: datetime,
        fence: Fence | None,
    ) -> int | None:
        """SQLite: write one event as the child's next ``seq`` in one autocommit statement
        (`ChildStatements.insert_next`): its ``seq``, or None when nothing was written (the
        child is missing, or, with ``fence``, its claim is not that)."""
        store = self._s
        sql = store.sql.children
        row = (p.turn, p.kind, p.data_json, p.source_json, batch, store.stamp(created_at))
        with store.db.cursor(write=True, abandoned=store.spend.abandoned, begin=False) as cursor:
            if fence is None:
                cursor.execute(sql.insert_next_unfenced, (*row, child_id))
            else:
                cursor.execute(sql.insert_next, (*row, child_id, *fence))
            written = cursor.fetchall()  # to the statement's end: its commit
        if not written:
            return None
        store.committed()
        return int(written[0][0])

    def seal(self, cursor: DBAPICursor, child_id: str) -> list[Any]:
        """Move the child's open rows into segments, inside the append that ended a turn
        (so under the child's lock): a later load reads one row per turn. Returns the rows
        it sealed (``seq, turn, kind, data, source, created_at, batch_id``)."""
        sql = self._s.sql.children
        cursor.execute(sql.open_rows, (child_id,))
        rows = list(cursor.fetchall())
        segments = seal_rows(rows)
        cursor.executemany(sql.insert_segment, [(child_id, *segment) for segment in segments])
        cursor.execute(sql.delete_sealed, (child_id, segments[-1].last_seq))
        return rows

    def landed(self, cursor: DBAPICursor, child_id: str, batch: str) -> list[SessionEvent]:
        """The events batch ``batch`` wrote, open or sealed since ([] for none).

        Open rows first: a seal moves rows into a segment and never back, so rows missed
        here because they were just sealed are found in the segments read after.
        """
        sql = self._s.sql.children
        cursor.execute(sql.landed, (child_id, batch))
        landed = decode_events(cursor)
        if landed:
            return landed
        cursor.execute(sql.landed_sealed, (child_id, f'%"{batch}"%'))
        for batches, events in cursor.fetchall():
            span = batch_range(batches, batch)
            if span is not None:
                landed += [e for e in decode_segment(events) if span[0] <= e.seq <= span[1]]
        return landed

    def tail(self, cursor: DBAPICursor, child_id: str) -> tuple[int, str | None, int]:
        """The child's highest ``seq``, its claim's runtime and its fencing number, read
        under the lock that serializes its appends (taken here on PostgreSQL; SQLite's
        write transaction already holds it)."""
        sql = self._s.sql.children
        if sql.lock_child is not None:
            # A statement of its own: the next one then reads with a snapshot taken after
            # the lock was granted, so it sees the previous holder's rows.
            cursor.execute(sql.lock_child, (child_id,))
            if cursor.fetchone() is None:
                raise not_found(child_id)
        cursor.execute(sql.last_seq, (child_id,))
        row = cursor.fetchone()
        if row is None:
            raise not_found(child_id)
        return int(row[0]), row[1], int(row[2])


def _fenced(child_id: str, fence: Fence, holder: str | None) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.FENCED,
        f"child {child_id}: runtime {fence[0]} lost its claim (fencing number {fence[1]}; the "
        f"child is now {'held by runtime ' + holder if holder else 'released'}); nothing was "
        "written",
        child_id=child_id,
    )


def not_found(child_id: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.CHILD_NOT_FOUND,
        f"child {child_id} is not in the store; check the id",
        child_id=child_id,
    )
