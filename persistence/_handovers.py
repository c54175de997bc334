"""Claims handed from one runtime to another with the same Task and the same turn: a
Task parked on an approval request continued (`Handovers.continue_parked`), a Task left for a
runtime with its child's provider and taken by one (`Handovers.await_provider`,
`Handovers.take_waiting`), a dead runtime's running Task recovered (`Handovers.recover`),
and a waiting Task steered, settled or parked. Each is one transaction under the child's
lock, taken with the steps of `persistence._claim_steps`. Apart from the claims that admit
a new Task (`persistence._claims.Claims`, which inherits these) because none of these
starts a Task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.contract import (
    EventKind,
    MessageSource,
    NewEvent,
    TaskOutcome,
    TaskStatus,
    utcnow,
)
from persistence._claim_steps import ClaimSteps, IsDead
from persistence._codec import from_json, prepare_events
from persistence._port import next_batch
from persistence._task_sql import Settlement

__all__ = ["RECOVERED", "Handovers", "Recovered"]

_RUNNING = TaskStatus.RUNNING.value


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


class Handovers(ClaimSteps):
    """The claim operations that hand a waiting or orphaned Task on (see the module)."""

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
