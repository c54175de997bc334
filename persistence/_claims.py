"""Claims: which runtime may write a child's turn, and the takeover of a dead one's.

A child's header carries its claim: the runtime, the Task, and a fencing number that grows
at each new claim. A runtime claims a child with compare-and-set in the same transaction
that admits the resume's Task, under the child's lock (PostgreSQL: its header row; SQLite:
the write transaction), so two runtimes can never both start a turn of one child. Every
append checks the claim in its own transaction (`SqlStore.append` ``fence=``): a runtime
that lost its claim can never write again. A claim lives as long as its runtime (no
per-child renewal), is released when its Task settles, and is taken over once its runtime
is dead: the old Task is then settled ``interrupted`` and its open turn closed first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import (
    ClaimConflict,
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    ParkedTask,
    RuntimeInfo,
    SubagentControlError,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from persistence._appends import not_found
from persistence._codec import from_json, prepare_events
from persistence._host_clock import LeaseNow, is_expired
from persistence._port import next_batch
from persistence._schema import utc_time
from persistence._segments import decode_segment
from persistence._task_sql import Settlement, admit_params, settle_params
from persistence._turn_usage import turn_usage, usage_column

if TYPE_CHECKING:
    from persistence._port import StorePort

__all__ = ["RECOVERED", "Claims", "IsDead", "Recoverable", "Recovered", "TaskInRecovery"]

IsDead = Callable[[RuntimeInfo, LeaseNow], bool]
"""Whether a runtime is dead at a given time (decided by the caller, which knows its host)."""


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


RECOVERED = EventKind.TASK_RECOVERED


@dataclass(frozen=True, slots=True)
class Recovered:
    """What `Claims.recover` did: the new fencing number (None: nothing taken), how many
    times the Task has been recovered in its turn, and whether it was settled
    ``interrupted`` here because that reached the limit."""

    fence: int | None
    recoveries: int
    exhausted: bool = False
    unframed: bool = False
    """Nothing taken because the Task never wrote its turn's frame (its runtime ended
    between the claim and the frame): there is no turn to go on in."""


def _recoveries_in(rows: list[Any], task_id: str) -> int:
    """How many ``task/recovered`` events of ``task_id`` the open rows hold."""
    count = 0
    for _seq, _turn, kind, data, *_rest in rows:
        if kind == RECOVERED and data and from_json(data).get("task_id") == task_id:
            count += 1
    return count


class Claims:
    """`SqlStore`'s claim operations (kept apart so the store module stays readable); the
    store delegates `SqlStore.admit_claiming` and `SqlStore.interrupt` here, and its
    ledger the settlements that no ``turn/end`` carried (`Claims.settle`)."""

    def __init__(self, port: StorePort) -> None:
        self._s = port

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

    def claim_of(
        self, cursor: DBAPICursor, child_id: str | None
    ) -> tuple[str | None, str | None, int] | None:
        """The child's claim (runtime, Task, fencing number), read under the child's lock;
        None for a child not in the store. The child's header only: a claim reads no
        transcript rows unless it takes over an open turn."""
        if child_id is None:
            return None
        cursor.execute(self._s.sql.children.claim_of, (child_id,))
        row = cursor.fetchone()
        return None if row is None else (row[0], row[1], int(row[2]))

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

    def continue_parked(self, task_id: str, child_id: str, runtime_id: str, *,
                        is_dead: IsDead) -> int | None:  # fmt: skip
        """Claim a child for the Task that waits on an approval request in it — parked, or
        left waiting by a dead runtime — so that ``runtime_id`` continues that Task (same
        id, same turn); the Task's row names ``runtime_id`` from now on.

        Returns:
            The new fencing number; None when the Task no longer holds the child's claim,
            or a live runtime (another, or this one) still holds it: nothing is written.
        """

        def op(_attempt: int) -> int | None:
            with self._s.db.cursor(write=True) as cursor:
                self._s.appends.tail(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if claim is None or claim[1] != task_id:
                    return None
                holder, _task, fence = claim
                if holder is not None:
                    info = self._runtime_row(cursor, holder)
                    if holder == runtime_id or (
                        info is not None and not is_dead(info, self._db_now(cursor))
                    ):
                        return None
                sql = self._s.sql
                cursor.execute(sql.tasks.moved, (runtime_id, task_id))
                if cursor.rowcount != 1:
                    return None  # settled meanwhile
                cursor.execute(sql.children.claim, (runtime_id, task_id, fence + 1, child_id))
            self._s.committed()
            return fence + 1

        return self._s.run(f"continue task {task_id}", op)

    def await_provider(self, task_id: str, child_id: str, runtime_id: str, provider: str) -> bool:
        """Leave a resume's Task, whose child's provider ``runtime_id`` lacks, for a runtime
        that has it: in one transaction under
        the child's lock, the Task's row names no runtime and ``provider`` as its detail
        (it reads ``queued``, `persistence._task_snapshots`; kept ``running`` in the
        column, so the running Tasks' partial index finds it: a sweep costs no scan of the
        settled ones), and the child's claim keeps the Task with no runtime (the fencing
        number grows). Its turn, opened with its message by the claim, stays open for
        `take_waiting`.

        Returns:
            Whether it was left so (False: the claim is no longer ``runtime_id``'s for it,
            or the Task is no longer running).
        """

        def op(attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                self._tail_or_none(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if claim is None or claim[1] != task_id:
                    return False
                if claim[0] is None and attempt > 1:  # our earlier attempt committed, unheard
                    cursor.execute(self._s.sql.tasks.runtime, (task_id,))
                    row = cursor.fetchone()
                    return row is not None and row[0] == ""
                if claim[0] != runtime_id:
                    return False
                cursor.execute(self._s.sql.tasks.await_provider, (provider, task_id))
                if cursor.rowcount != 1:
                    return False
                cursor.execute(self._s.sql.children.park, (child_id, task_id))
            self._s.committed()
            return True

        return self._s.run(f"leave task {task_id} for provider {provider}", op)

    def take_waiting(self, task_id: str, child_id: str, runtime_id: str) -> int | None:
        """Take a Task left for a runtime with its child's provider (`await_provider`), so
        that ``runtime_id`` runs it: same Task, in the turn its claim opened. In one
        transaction under the child's lock: the Task reads ``running`` in ``runtime_id``,
        the child's claim is ``runtime_id``'s with a new fencing number.

        Returns:
            The fencing number; None when it is not there to take (taken by another
            runtime, or settled).
        """

        def op(attempt: int) -> int | None:
            with self._s.db.cursor(write=True) as cursor:
                last = self._tail_or_none(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if last is None or claim is None or claim[1] != task_id:
                    return None
                holder, _task, fence = claim
                if holder == runtime_id and attempt > 1:  # our earlier attempt committed
                    return fence
                if holder is not None:
                    return None
                cursor.execute(self._s.sql.tasks.take_waiting, (runtime_id, task_id))
                if cursor.rowcount != 1:
                    return None
                cursor.execute(
                    self._s.sql.children.claim, (runtime_id, task_id, fence + 1, child_id)
                )
            self._s.committed()
            return fence + 1

        return self._s.run(f"take waiting task {task_id}", op)

    def recover(self, task_id: str, child_id: str, runtime_id: str, *, is_dead: IsDead,
                limit: int) -> Recovered:  # fmt: skip
        """Take over a running Task whose runtime is dead (crashed, closed, or its lease
        lapsed), so that ``runtime_id`` runs it on: same Task, same turn.
        In one transaction under the child's lock: a ``task/recovered`` event
        is written into the turn the Task opened, the Task's row names ``runtime_id``, and
        the child's claim is ``runtime_id``'s with a new fencing number (the dead runtime
        can never write again). A Task recovered ``limit`` times already in this turn is
        settled ``interrupted`` instead, saying so, and its turn closed.

        Returns:
            `Recovered`: the new fencing number and how many times the Task has been
            recovered (this one included); or ``fence=None`` when there is nothing to take
            here (a live runtime holds it, it settled, it waits on an approval request,
            or it opened no turn), with ``exhausted`` true when it was settled here.
        """

        def op(_attempt: int) -> Recovered:
            with self._s.db.cursor(write=True) as cursor:
                last = self._tail_or_none(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if last is None or claim is None or claim[1] != task_id:
                    return Recovered(None, 0)
                holder, _task, fence = claim
                if holder is None or holder == runtime_id:
                    return Recovered(None, 0)
                info = self._runtime_row(cursor, holder)
                if info is not None and not is_dead(info, self._db_now(cursor)):
                    return Recovered(None, 0)
                cursor.execute(self._s.sql.tasks.status, (task_id,))
                row = cursor.fetchone()
                if row is None or row[0] != _RUNNING or self._parkable(cursor, task_id):
                    return Recovered(None, 0)
                turn, rows = self._open_turn_of(cursor, child_id, task_id)
                if turn is None:  # no frame of its own: nothing to go on from
                    return Recovered(None, 0, unframed=True)
                done = _recoveries_in(rows, task_id)
                if done >= limit:
                    detail = (
                        f"interrupted: its runtime ended {done + 1} times during this turn "
                        f"(recovered {done} times, the limit is {limit}); the turn was not "
                        "carried on again. Send the child a message to continue it"
                    )
                    outcome = TaskOutcome(status=TaskStatus.INTERRUPTED, detail=detail)
                    settled = self._interrupt_in(
                        cursor, task_id, child_id, last, (task_id, outcome, utcnow())
                    )
                    exhausted = Recovered(None, done, exhausted=settled)
                else:
                    data = {"task_id": task_id, "runtime_id": runtime_id,
                            "from_runtime": holder, "recovery": done + 1}  # fmt: skip
                    (pending,) = prepare_events([NewEvent(kind=RECOVERED, turn=turn, data=data)])
                    cursor.execute(
                        self._s.sql.children.insert,
                        (child_id, last[0] + 1, turn, pending.kind, pending.data_json, None,
                         next_batch(), self._s.stamp(utcnow())),
                    )  # fmt: skip
                    cursor.execute(self._s.sql.tasks.recovered, (runtime_id, done + 1, task_id))
                    cursor.execute(
                        self._s.sql.children.claim, (runtime_id, task_id, fence + 1, child_id)
                    )
                    exhausted = Recovered(fence + 1, done + 1)
            self._s.committed()
            return exhausted

        return self._s.run(f"recover task {task_id}", op)

    def steer_parked(
        self, task_id: str, child_id: str, data: dict[str, Any], source: MessageSource
    ) -> bool:
        """Write a ``steering/message`` (``data``, ``source``) into the open turn of
        ``task_id``, parked on an approval request or left for a runtime with its child's
        provider (`await_provider`; either way its claim holds no runtime), in one
        transaction under the child's lock: the runtime that continues or takes it reads
        it with the turn. False, writing nothing, when the Task is not waiting there any
        more (a runtime continues it, or it settled)."""

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                last = self._tail_or_none(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if last is None or claim is None or claim[0] is not None or claim[1] != task_id:
                    return False
                if not (self._parkable(cursor, task_id) or self._awaits_provider(cursor, task_id)):
                    return False
                turn, _rows = self._open_turn_of(cursor, child_id, task_id)
                if turn is None:
                    return False
                event = NewEvent(kind=EventKind.STEERING_MESSAGE, turn=turn, data=data,
                                 source=source)  # fmt: skip
                (pending,) = prepare_events([event])
                cursor.execute(
                    self._s.sql.children.insert,
                    (child_id, last[0] + 1, turn, pending.kind, pending.data_json,
                     pending.source_json, next_batch(), self._s.stamp(utcnow())),
                )  # fmt: skip
            self._s.committed()
            return True

        return self._s.run(f"steer parked task {task_id}", op)

    def settle_parked(self, settlement: Settlement, *, is_dead: IsDead) -> bool:
        """Settle a Task that waits on an approval request with no live run — parked, or
        left waiting by a dead runtime — closing its open turn with a ``turn/end`` of the
        settlement's status and releasing the child's claim, in one transaction under the
        child's lock.

        Returns:
            Whether it was settled here; False when a live runtime holds the child for it
            (or it settled already), changing nothing.
        """
        task_id = settlement[0]

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                cursor.execute(self._s.sql.tasks.child, (task_id,))
                row = cursor.fetchone()
                if row is None or row[0] is None:
                    return False
                child_id = row[0]
                last = self._tail_or_none(cursor, child_id)
                claim = self.claim_of(cursor, child_id)
                if claim is None or claim[1] != task_id:
                    return False
                holder = claim[0]
                if holder is not None:
                    info = self._runtime_row(cursor, holder)
                    if info is not None and not is_dead(info, self._db_now(cursor)):
                        return False
                settled = self._interrupt_in(cursor, task_id, child_id, last, settlement)
            if settled:
                self._s.committed()
            return settled

        return self._s.run(f"settle parked task {task_id}", op)

    def release_waiting(self, task_id: str, child_id: str, runtime_id: str) -> bool:
        """Park the child's claim that ``runtime_id`` holds for ``task_id``, a Task waiting
        on (or just answered on) an approval request whose run ended here without parking
        (fenced): the claim keeps the Task with no runtime, the fencing number grows, and
        the answer continues it wherever it is given. Returns whether it parked it (False:
        the claim is not this runtime's for this Task, or the Task waits on nothing)."""

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=True) as cursor:
                self._s.appends.tail(cursor, child_id)  # the child's lock
                claim = self.claim_of(cursor, child_id)
                if claim is None or claim[:2] != (runtime_id, task_id):
                    return False
                if not self._parkable(cursor, task_id):
                    return False
                cursor.execute(self._s.sql.children.park, (child_id, task_id))
            self._s.committed()
            return True

        return self._s.run(f"park the claim of task {task_id}", op)

    def _runs_in(self, cursor: DBAPICursor, task_id: str, runtime_id: str) -> bool:
        """Whether the Task's row still names ``runtime_id`` (a missing row: yes, nothing
        moved it)."""
        cursor.execute(self._s.sql.tasks.runtime, (task_id,))
        row = cursor.fetchone()
        return row is None or row[0] == runtime_id

    def _awaits_provider(self, cursor: DBAPICursor, task_id: str) -> bool:
        """Whether a Task is left for a runtime with its child's provider (running, no
        runtime on its row: `await_provider`)."""
        cursor.execute(self._s.sql.tasks.status, (task_id,))
        status = cursor.fetchone()
        cursor.execute(self._s.sql.tasks.runtime, (task_id,))
        runtime = cursor.fetchone()
        return (status is not None and status[0] == _RUNNING
                and runtime is not None and runtime[0] == "")  # fmt: skip

    def _parkable(self, cursor: DBAPICursor, task_id: str) -> bool:
        """Whether a Task waits on an approval request whose run can be continued."""
        cursor.execute(self._s.sql.approvals.parkable, (task_id,))
        row = cursor.fetchone()
        return row is not None and bool(row[0])

    def _interrupt_in(
        self,
        cursor: DBAPICursor,
        task_id: str,
        child_id: str | None,
        last: tuple[int, str | None, int] | None,
        settlement: Settlement,
    ) -> bool:
        """Inside the caller's transaction, under the child's lock (``last``, its tail,
        None for no transcript): settle the running Task, close the open turn it opened
        with a ``turn/end`` of the settlement's status, take its claim away."""
        sql = self._s.sql
        stamp = self._s.stamp(settlement[2])
        # The settlement first: it changes a running Task only, and its row lock makes a
        # concurrent sweeper wait, then find nothing left to change.
        cursor.execute(sql.tasks.settle, settle_params(settlement, stamp))
        if cursor.rowcount != 1:
            return False
        if child_id is None or last is None:
            return True
        turn, rows = self._open_turn_of(cursor, child_id, task_id)
        if turn is not None:
            # What the turn wrote so far is what the Task spent (a dead runtime's too).
            spend = usage_column(turn_usage(rows, turn))
            if spend is not None:
                cursor.execute(sql.tasks.spend, (spend, task_id))
            end = {"task_id": task_id, "status": settlement[1].status.value}
            (pending,) = prepare_events([NewEvent(kind=EventKind.TURN_END, turn=turn, data=end)])
            cursor.execute(
                sql.children.insert,
                (child_id, last[0] + 1, turn, pending.kind, pending.data_json, None,
                 next_batch(), stamp),
            )  # fmt: skip
            self._s.appends.seal(cursor, child_id)
        # Its claim is gone, and its fencing number with it: its runtime never writes again.
        cursor.execute(sql.children.revoke, (child_id, task_id))
        return True

    def _open_turn_of(
        self, cursor: DBAPICursor, child_id: str, task_id: str
    ) -> tuple[int | None, list[Any]]:
        """The turn ``task_id`` opened and never ended, if it is the child's open tail,
        and the child's open rows."""
        cursor.execute(self._s.sql.children.open_rows, (child_id,))
        rows = list(cursor.fetchall())
        if not rows or rows[-1][2] == EventKind.TURN_END:
            return None, rows
        for _seq, turn, kind, data, *_rest in reversed(rows):
            if kind == EventKind.TURN_START:
                opened_by = from_json(data).get("task_id") if data else None
                return (int(turn) if opened_by == task_id else None), rows
        return None, rows

    def _tail_or_none(
        self, cursor: DBAPICursor, child_id: str | None
    ) -> tuple[int, str | None, int] | None:
        if child_id is None:
            return None
        try:  # first: the child's lock, as every append takes it
            return self._s.appends.tail(cursor, child_id)
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND:
                return None  # never published: no transcript, no claim
            raise

    def _runtime_row(self, cursor: DBAPICursor, runtime_id: str) -> RuntimeInfo | None:
        cursor.execute(self._s.sql.runtimes.runtime, (runtime_id,))
        row = cursor.fetchone()
        if row is None:
            return None
        host, pid, boot_id, ttl, started, heartbeat, closed, heartbeat_boot_s = row
        return RuntimeInfo(
            runtime_id=runtime_id,
            host=host,
            pid=pid,
            boot_id=boot_id,
            lease_ttl_s=ttl,
            started_at=utc_time(started),
            heartbeat_at=utc_time(heartbeat),
            closed_at=None if closed is None else utc_time(closed),
            heartbeat_boot_s=heartbeat_boot_s,
        )

    def _db_now(self, cursor: DBAPICursor) -> LeaseNow:
        now_sql = self._s.sql.runtimes.now
        if now_sql is not None:
            cursor.execute(now_sql)
            (now,) = cursor.fetchone() or (None,)
            return self._s.ledger.lease_now(utc_time(now))
        return self._s.ledger.lease_now(utcnow())


_TURN_END_AT = re.compile(r'\[(\d+),(\d+),"turn/end",')
_RUNNING = TaskStatus.RUNNING.value
