"""Claims: which runtime may write a child's turn, and the takeover of a dead one's.

A child's header carries its claim: the runtime, the Task, and a fencing number that grows
at each new claim. A runtime claims a child with compare-and-set in the same transaction
that admits the resume's Task, under the child's lock (PostgreSQL: its header row; SQLite:
the write transaction), so two runtimes can never both start a turn of one child. Every
append checks the claim in its own transaction (`SqlStore.append` ``fence=``): a runtime
that lost its claim can never write again. A claim lives as long as its runtime (no
per-child renewal), is released when its Task settles, and is taken over once its runtime
is dead: the old Task is then settled ``interrupted`` and its open turn closed first.

This module admits a Task with its claim and settles Tasks; the claims handed on with the
same Task (continued, taken, recovered) are `persistence._handovers`, and the steps both
take under the child's lock `persistence._claim_steps`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import (
    ClaimConflict,
    ErrorCode,
    NewEvent,
    ParkedTask,
    SubagentControlError,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from persistence._appends import not_found
from persistence._claim_steps import IsDead
from persistence._codec import prepare_events
from persistence._handovers import RECOVERED, Handovers, Recovered
from persistence._host_clock import is_expired
from persistence._port import next_batch
from persistence._segments import decode_segment
from persistence._task_sql import Settlement, admit_params

__all__ = ["RECOVERED", "Claims", "IsDead", "Recoverable", "Recovered", "TaskInRecovery"]


class Recoverable(Protocol):
    """What a claim asks the claiming runtime's recovery (a dead runtime's running Task is
    carried on, not ended)."""

    def recovers_here(self, provider: str | None) -> bool:
        """Whether it carries on a dead runtime's running Task of a child with this
        provider (recovery on, the provider here and able to carry a turn on)."""
        ...

    def carrying(self, task_id: str) -> bool:
        """Whether it is starting this Task here right now, taken over from a runtime
        that ended (the claim is its own already, the activation not yet begun)."""
        ...


class TaskInRecovery(SubagentControlError):
    """``NOT_DELIVERED``: the child's claim belongs to a running Task of a runtime that
    ended, which the claiming runtime carries on (recovery: same Task, same turn) rather
    than interrupt it for a new one. The sender sends again: the message then
    steers the recovered Task (``task_id``)."""

    def __init__(self, *, child_id: str, task_id: str, holder: str) -> None:
        super().__init__(
            ErrorCode.NOT_DELIVERED,
            f"child {child_id}: its task {task_id} was running in runtime {holder}, which "
            "ended; that task is being carried on here (same task, same turn), so the message "
            "was not delivered and no task was started: send it again to steer that task",
            child_id=child_id,
            task_id=task_id,
        )
        self.holder = holder

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_in_recovery, (self.child_id, self.task_id, self.holder))


def _rebuild_in_recovery(child_id: str, task_id: str, holder: str) -> TaskInRecovery:
    return TaskInRecovery(child_id=child_id, task_id=task_id, holder=holder)


class Claims(Handovers):
    """`SqlStore`'s claim operations (kept apart so the store module stays readable); the
    store delegates `SqlStore.admit_claiming` and `SqlStore.interrupt` here, and its
    ledger the settlements that no ``turn/end`` carried (`Claims.settle`)."""

    def admit_claiming(
        self,
        task: TaskSnapshot,
        *,
        is_dead: IsDead,
        opening: Sequence[NewEvent] = (),
        recoverable: Recoverable | None = None,
    ) -> int | None:
        """Admit a resume's Task and claim its child for the Task's runtime, in one
        transaction under the child's lock.

        A claim held by a dead runtime is taken over: its Task is settled ``interrupted``
        and its open turn closed, in the same transaction — unless ``recoverable`` says the
        claiming runtime carries that Task on (its child's provider, from the header), or
        is starting it already: then nothing is written and `TaskInRecovery` is raised.

        ``opening``: the events that open the Task's turn (``turn/start`` naming the Task,
        the message as ``user/message``), written in the same transaction as the child's
        next turn (their ``turn`` is set here), so the message is durable before the
        sender hears ``started`` (no crash after an
        acknowledgement loses the message). Written only when the Task's owner
        is the child's recorded parent: anyone else's message is refused by the
        activation (``UNAUTHORIZED``) and must never be in the transcript.

        Returns:
            The new fencing number.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` naming the live runtime that holds
                the child; ``CHILD_NOT_FOUND`` when the child is not in the store (read
                under the lock the claim takes anyway, so the refusal costs no round trip);
                `TaskInRecovery` (above). Nothing is written.
        """
        runtime_id = task.runtime_id or ""
        return self._s.run(
            f"claim child {task.child_id}",
            lambda attempt: self._admit_claiming(
                task, runtime_id, is_dead, attempt, opening, recoverable
            ),
        )

    def interrupt(self, task: TaskSnapshot, detail: str) -> bool:
        """Settle a running Task ``interrupted`` (its runtime is dead), close its child's
        open turn with a ``turn/end`` (status ``interrupted``) and take its claim away
        (the fencing number grows, so its runtime can never write again), in one
        transaction under the child's lock: once, however many runtimes try at once.

        A Task whose run waited on an approval request that can be continued (or had
        just been answered) is not interrupted: it goes on elsewhere, once answered.

        Returns:
            Whether this call settled it (False: it had settled already, or it waits).
        """
        if self._s.read_only:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "this store was opened read-only; nothing was written"
            )
        settlement: Settlement = (
            task.id,
            TaskOutcome(status=TaskStatus.INTERRUPTED, detail=detail),
            utcnow(),
        )

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                last = self._tail_or_none(cursor, task.child_id)
                if task.runtime_id is not None and not self._runs_in(
                    cursor, task.id, task.runtime_id
                ):
                    # Carried on by another runtime since (recovered): the runtime
                    # judged dead, or this one fenced, has nothing left to settle.
                    return False
                if self._parkable(cursor, task.id):
                    # Its run waited for (or had just been given) an approval answer: the
                    # Task goes on in whichever runtime continues it, not interrupted.
                    return False
                settled = self._interrupt_in(cursor, task.id, task.child_id, last, settlement)
            if settled:
                self._s.committed()
            return settled

        return self._s.run(f"settle interrupted task {task.id}", op)

    def settle(self, settlement: Settlement) -> bool:
        """Settle a running Task whose settlement was not written with its turn's end (it
        never published, or its ``turn/end`` could not be written): the settlement, its
        child's open turn closed by a ``turn/end`` with the Task's status (only a turn
        this Task opened, still the child's open tail), and its claim released, in one
        transaction under the child's lock. A Task is never settled with its turn left
        open, so no later turn can begin on top of it, even after a store outage.

        Returns:
            Whether this call settled it (False: it had settled already, or is unknown).
        """
        task_id = settlement[0]

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                cursor.execute(self._s.sql.tasks.child, (task_id,))
                row = cursor.fetchone()
                child_id = None if row is None else row[0]
                last = self._tail_or_none(cursor, child_id)
                settled = self._interrupt_in(cursor, task_id, child_id, last, settlement)
            if settled:
                self._s.committed()
            return settled

        return self._s.run(f"settle task {task_id}", op)

    # -- one attempt -------------------------------------------------------------------

    def _admit_claiming(
        self,
        task: TaskSnapshot,
        runtime_id: str,
        is_dead: IsDead,
        attempt: int,
        opening: Sequence[NewEvent] = (),
        recoverable: Recoverable | None = None,
    ) -> int | None:
        tasks = self._s.sql.tasks
        with self._s.db.cursor(write=True) as cursor:
            claim = self.claim_of(cursor, task.child_id)
            if claim is None:
                # No Task for a child that is not there: the sender hears it at once.
                raise not_found(task.child_id or "")
            if attempt > 1:  # our earlier attempt may have committed, unheard
                cursor.execute(tasks.status, (task.id,))
                if cursor.fetchone() is not None:
                    return int(claim[2]) if claim is not None and claim[0] == runtime_id else None
            fence = self.claim(cursor, task, runtime_id, claim, is_dead, recoverable)
            cursor.execute(tasks.admit, admit_params(task, self._s.stamp(task.created_at)))
            if opening:
                self._open_turn(cursor, task, opening)
        self._s.committed()
        return fence

    def _open_turn(self, cursor: DBAPICursor, task: TaskSnapshot, opening: Sequence[NewEvent]
                   ) -> None:  # fmt: skip
        """Write ``opening`` as the child's next turn, inside the claim's transaction (after
        the claim: a takeover there closed a dead runtime's open turn first)."""
        child_id = task.child_id
        assert child_id is not None
        children = self._s.sql.children
        # One statement, under the lock the claim took: the child's parent, its open rows'
        # highest turn and seq, its last sealed seq and the tail of that segment's text.
        cursor.execute(children.frame_facts, (child_id, child_id))
        parent, open_turn, open_seq, sealed_seq, tail = cursor.fetchone() or (None,) * 5
        if parent != task.owner_session:
            return  # not its parent: the activation refuses it, nothing is written
        last_seq = int(open_seq) if open_seq is not None else int(sealed_seq or 0)
        if open_turn is not None:
            last_turn = int(open_turn)
        elif sealed_seq is None:
            last_turn = 0
        else:
            last_turn = self._sealed_turn(cursor, child_id, int(sealed_seq), tail)
        # Encoded as they came (their ``turn`` a placeholder) and written with the turn
        # found here: a copy of each event with its turn would cost more than the insert.
        turn = last_turn + 1
        pending = prepare_events(list(opening))
        stamp = self._s.stamp(task.created_at)
        batch = next_batch()
        cursor.executemany(
            children.insert,
            [
                (child_id, seq, turn, p.kind, p.data_json, p.source_json, batch, stamp)
                for seq, p in enumerate(pending, start=last_seq + 1)
            ],
        )

    def _sealed_turn(self, cursor: DBAPICursor, child_id: str, last_seq: int, tail: object
                     ) -> int:  # fmt: skip
        """The turn of the child's last sealed event (``last_seq``): read from ``tail``, the
        end of its last segment's text, where a turn's seal ends with its ``turn/end``
        (``[seq,turn,"turn/end",...``: a JSON string cannot hold that unescaped quote),
        else from the whole segment."""
        if isinstance(tail, bytes | bytearray | memoryview):
            tail = bytes(tail).decode("utf-8", errors="ignore")
        if isinstance(tail, str) and tail:
            # The seal's last event is its ``turn/end``: found from the end, not by a scan.
            at = tail.rfind(f"[{last_seq},")
            found = _TURN_END_AT.match(tail, at) if at >= 0 else None
            if found is not None:
                return int(found[2])
        cursor.execute(self._s.sql.children.last_segment, (child_id,))
        row = cursor.fetchone()
        if row is None:
            return 0
        events = row[0]
        if isinstance(events, bytes | bytearray | memoryview):
            events = bytes(events).decode("utf-8")
        decoded = decode_segment(events)
        return decoded[-1].turn if decoded else 0

    def claim(
        self,
        cursor: DBAPICursor,
        task: TaskSnapshot,
        runtime_id: str,
        claim: tuple[str | None, str | None, int] | None,
        is_dead: IsDead,
        recoverable: Recoverable | None = None,
    ) -> int | None:
        """Claim the child for ``task`` inside the caller's transaction; the new fencing
        number, or None for a child not in the store (``claim`` as `claim_of` read it)."""
        if claim is None:
            return None
        self._take_claim(cursor, task, runtime_id, claim, is_dead, recoverable)
        return claim[2] + 1

    def _take_claim(
        self,
        cursor: DBAPICursor,
        task: TaskSnapshot,
        runtime_id: str,
        claim: tuple[str | None, str | None, int],
        is_dead: IsDead,
        recoverable: Recoverable | None = None,
    ) -> None:
        child_id = task.child_id
        assert child_id is not None
        holder, held_by_task, fence = claim
        if held_by_task is not None and holder is None:
            # Parked on an approval request: the message goes into its turn.
            raise ParkedTask(child_id=child_id, task_id=held_by_task)
        if holder is not None:
            info = self._runtime_row(cursor, holder)
            now = self._db_now(cursor)
            if holder != runtime_id and info is not None and not is_dead(info, now):
                unsure = (
                    " (its lease lapsed, but this runtime has not yet renewed its own without "
                    "a break for a full lease — it opened, or lost the store, too recently to "
                    "tell a dead runtime from one an outage kept silent; retry after the lease)"
                    if is_expired(info, now)
                    else ""
                )
                raise ClaimConflict(
                    f"child {child_id} is running in runtime {holder} (process {info.pid} on "
                    f"{info.host}){unsure}; the message was not delivered: send it to that "
                    "runtime, or retry once its task has settled",
                    child_id=child_id,
                    runtime_id=holder,
                )
            if held_by_task is not None and self._parkable(cursor, held_by_task):
                # A dead runtime's run that waited for an answer: its Task goes on, in the
                # runtime that continues it (`continue_parked`), not interrupted.
                raise ParkedTask(child_id=child_id, task_id=held_by_task)
            if held_by_task is not None and recoverable is not None:
                # A dead runtime's running Task this runtime carries on (recovery), or is
                # starting here already: never interrupted for a new one; the message
                # steers it once it goes on here.
                if holder == runtime_id:
                    carried = recoverable.carrying(held_by_task)
                else:
                    cursor.execute(self._s.sql.children.provider_of, (child_id,))
                    row = cursor.fetchone()
                    carried = recoverable.recovers_here(None if row is None else row[0])
                if carried:
                    raise TaskInRecovery(child_id=child_id, task_id=held_by_task, holder=holder)
            if held_by_task is not None:
                detail = (
                    f"interrupted: its runtime {holder} ended before the task settled "
                    f"(taken over by runtime {runtime_id}); send the child a message to "
                    "continue it"
                    if holder != runtime_id
                    # Our own earlier Task, whose end we could not record yet (our lease
                    # was lost, or the store out of reach): not a takeover.
                    else f"interrupted: its runtime {holder} lost its lease or the store "
                    "before it could record the task's end; send the child a message to "
                    "continue it"
                )
                outcome = TaskOutcome(status=TaskStatus.INTERRUPTED, detail=detail)
                tail = self._s.appends.tail(cursor, child_id)
                settlement = (held_by_task, outcome, utcnow())
                self._interrupt_in(cursor, held_by_task, child_id, tail, settlement)
        cursor.execute(self._s.sql.children.claim, (runtime_id, task.id, fence + 1, child_id))


_TURN_END_AT = re.compile(r'\[(\d+),(\d+),"turn/end",')
