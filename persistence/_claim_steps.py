"""The steps every claim operation (`persistence._claims`, `persistence._handovers`) takes
inside its transaction, under the child's lock: read the child's tail (which takes the lock)
and claim, the Task's row, its holder's runtime row and the lease clock, the open turn a
Task opened, and the settlement that closes that turn and revokes the claim. Apart from the
operations so each of those modules holds one kind of move and both share these steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import (
    ErrorCode,
    EventKind,
    NewEvent,
    RuntimeInfo,
    SubagentControlError,
    TaskStatus,
    utcnow,
)
from persistence._codec import from_json, prepare_events
from persistence._host_clock import LeaseNow
from persistence._port import next_batch
from persistence._schema import utc_time
from persistence._task_sql import Settlement, settle_params
from persistence._turn_usage import turn_usage, usage_column

if TYPE_CHECKING:
    from persistence._port import StorePort

__all__ = ["ClaimSteps", "IsDead"]

IsDead = Callable[[RuntimeInfo, LeaseNow], bool]
"""Whether a runtime is dead at a given time (decided by the caller, which knows its host)."""

_RUNNING = TaskStatus.RUNNING.value


class ClaimSteps:
    """The in-transaction steps the claim operations share; ``port`` is the store's."""

    def __init__(self, port: StorePort) -> None:
        self._s = port

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
