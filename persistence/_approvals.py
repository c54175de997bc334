"""Approval requests: written with their event, answered once, taken once.

A request's life, each step one transaction:

- **asked** (`ApprovalBook.asking`, run inside the append of its ``approval/request``
  event): its row, ``open``, and its Task ``running`` → ``input_required``;
- **answered** (`ApprovalBook.answer`): ``open`` → ``answered`` by compare-and-set, under the
  child's lock, so exactly one answer is taken whoever sends it, and the answerer learns in
  the same transaction where the child's claim is: with a live runtime whose run waits (it
  takes the answer), or parked / with a dead runtime (the answerer continues the Task);
- **parked** (`ApprovalBook.park`): a run that waited past its grace gives the child's claim
  up — no runtime, the claim's Task still this one — unless an answer came first (both
  under the child's lock: one of the two wins, never neither);
- **taken** (`ApprovalBook.taking`, inside the append of its ``approval/answer`` event):
  ``answered`` → ``closed``, its Task ``input_required`` → ``running``.

A request whose Task settled (killed, interrupted) is closed whatever its row says: it is
answered by no one and noticed to no one (every read joins the Task's status).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.engine.interfaces import DBAPICursor

from controlplane.contract import (
    ApprovalAnswer,
    ApprovalRequest,
    ApprovalState,
    ErrorCode,
    JsonValue,
    MessageSource,
    SubagentControlError,
    TaskStatus,
    utcnow,
)
from persistence._schema import approvals_table, utc_time
from persistence._task_sql import Fence, TxStep

if TYPE_CHECKING:
    from persistence._port import StorePort

__all__ = ["Answered", "ApprovalBook", "StoredRequest", "WaitingRequest"]

_INPUT = TaskStatus.INPUT_REQUIRED.value


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """An approval request as its row keeps it."""

    request_id: str
    task_id: str
    child_id: str
    parent_session: str
    turn: int
    call_id: str
    tool: str
    arguments: dict[str, JsonValue]
    reason: str | None
    pending: list[JsonValue]
    parkable: bool
    created_at: datetime
    deadline_at: datetime | None = None
    provider: str = ""

    def public(self) -> ApprovalRequest:
        """The request as `TaskSnapshot.request` shows it."""
        return ApprovalRequest(
            id=self.request_id,
            tool=self.tool,
            arguments=self.arguments,
            reason=self.reason,
            child_id=self.child_id,
            task_id=self.task_id,
            created_at=self.created_at,
            deadline_at=self.deadline_at,
        )


@dataclass(frozen=True, slots=True)
class Answered:
    """What `ApprovalBook.answer` found: the request, and where the child's claim was when
    the answer went in (``holder`` None: parked)."""

    request: StoredRequest
    holder: str | None


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """A request not yet taken whose Task still waits: what a sweep decides on."""

    request: StoredRequest
    state: ApprovalState
    holder: str | None
    claimed_by_it: bool
    """Whether the child's claim is still this request's Task's (held or parked)."""


class ApprovalBook:
    """The store's approval requests (`SqlStore.approvals`). Thread-safe; every operation
    is one short transaction under the store's retry policy."""

    def __init__(self, port: StorePort) -> None:
        self._s = port
        self._db = port.db

    # -- inside an append's transaction --------------------------------------------------

    def asking(self, request: StoredRequest) -> TxStep:
        """The statements that record ``request`` in its event's append: its row, and its
        Task ``input_required`` (a Task no longer running asks nothing: the append fails)."""
        sql, stamp = self._s.sql, self._s.stamp

        def step(cursor: DBAPICursor) -> None:
            cursor.execute(sql.tasks.asks, (request.task_id,))
            if cursor.rowcount != 1:
                raise _not_running(request.task_id)
            cursor.execute(
                sql.approvals.insert,
                (request.request_id, request.task_id, request.child_id, request.parent_session,
                 request.turn, request.call_id, request.tool, request.provider,
                 _json(request.arguments), request.reason, _json(request.pending),
                 request.parkable, stamp(request.created_at),
                 None if request.deadline_at is None else stamp(request.deadline_at)),
            )  # fmt: skip

        return step

    def taking(self, request_id: str, task_id: str) -> TxStep:
        """The statements that take an answer in its ``approval/answer`` event's append:
        the request closed, its Task ``running`` again."""
        sql = self._s.sql

        def step(cursor: DBAPICursor) -> None:
            cursor.execute(sql.approvals.take, (request_id,))
            if cursor.rowcount != 1:
                raise _closed(request_id, "its answer was taken already")
            cursor.execute(sql.tasks.resumes, (task_id,))

        return step

    # -- one transaction each -------------------------------------------------------------

    def answer(
        self,
        request_id: str,
        *,
        allow: bool,
        note: str | None,
        source: MessageSource,
        session: str | None,
    ) -> Answered:
        """Answer a request once: ``open`` → ``answered``, under its child's lock.

        ``session``: the answering parent session, which must be the child's recorded
        parent; None skips that check (a human source, or a deadline).

        Raises:
            SubagentControlError: ``REQUEST_NOT_FOUND`` for an unknown request, or one
                of another session's children; ``REQUEST_CLOSED`` for one answered
                already, or whose Task settled. Nothing is changed then.
        """
        token = _json({"source": source.model_dump(mode="json"), "answer": utcnow().isoformat()})
        sql = self._s.sql.approvals

        def op(attempt: int) -> Answered:
            with self._db.cursor(write=True) as cursor:
                found = self._request(cursor, request_id)
                if found is None or (session is not None and found[0].parent_session != session):
                    raise _unknown(request_id)
                request = found[0]
                self._s.appends.tail(cursor, request.child_id)  # the child's lock
                cursor.execute(sql.state_of, (request_id,))
                state, answered_by, status, holder, claim_task = cursor.fetchone() or _GONE
                if attempt > 1 and state == "answered" and answered_by == token:
                    return Answered(request, holder)  # our own earlier commit, unheard
                if state != "open":
                    raise _closed(request_id, "it was answered already")
                if status != _INPUT or claim_task != request.task_id:
                    raise _closed(request_id, f"its task {request.task_id} is {status}")
                cursor.execute(
                    sql.answer, (allow, note, token, self._s.stamp(utcnow()), request_id)
                )
                if cursor.rowcount != 1:
                    raise _closed(request_id, "it was answered already")
                # Answered, the Task no longer waits for input: it reads running while its
                # run takes the answer (a `wait` after the answer waits for its outcome).
                cursor.execute(self._s.sql.tasks.resumes, (request.task_id,))
                return Answered(request, holder)

        return self._s.run(f"answer request {request_id}", op)

    def prune(self, before: datetime) -> int:
        """Delete the requests done with before ``before`` (answered then, or asked then
        if never answered): closed (the run took the answer), or whose Task no longer
        runs. The transcript keeps each request and answer; an answer naming a pruned
        request is ``REQUEST_NOT_FOUND``. How many went."""
        statement = self._s.sql.approvals.prune

        def op(_attempt: int) -> int:
            with self._s.db.cursor(write=True) as cursor:
                cursor.execute(statement, (self._s.stamp(before),))
                return int(cursor.rowcount)

        return self._s.run("prune answered approval requests", op)

    def park(self, request_id: str, child_id: str, fence: Fence) -> bool:
        """Give the child's claim up while ``request_id`` waits (the claim keeps its Task,
        with no runtime; the fencing number grows, so this runtime writes no more). False,
        changing nothing, when the request was answered first: the run takes the answer.

        Raises:
            SubagentControlError: ``FENCED`` when the claim is no longer this runtime's.
        """
        sql = self._s.sql

        def op(_attempt: int) -> bool:
            with self._db.cursor(write=True) as cursor:
                _last, holder, number = self._s.appends.tail(cursor, child_id)
                cursor.execute(sql.approvals.state_only, (request_id,))
                row = cursor.fetchone()
                if row is not None and row[0] != "open":
                    return False
                if (holder, number) != fence:
                    if holder is None and number == fence[1] + 1:
                        return True  # our own earlier commit, unheard
                    raise SubagentControlError(
                        ErrorCode.FENCED,
                        f"child {child_id}: runtime {fence[0]} lost its claim before it could "
                        "park; nothing was written",
                        child_id=child_id,
                    )
                cursor.execute(sql.children.park_held, (child_id, fence[0], fence[1]))
                return True

        return self._s.run(f"park child {child_id}", op)

    def state(self, request_id: str) -> tuple[ApprovalState, ApprovalAnswer | None, str]:
        """A request's state, its answer once answered, and its Task's status."""

        def op(_attempt: int) -> tuple[ApprovalState, ApprovalAnswer | None, str]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._s.sql.approvals.answer_of, (request_id,))
                row = cursor.fetchone()
            if row is None:
                raise _unknown(request_id)
            state, allow, note, source, status = row
            answer = None
            if state != "open" and allow is not None:
                answer = ApprovalAnswer(
                    request_id=request_id,
                    allow=bool(allow),
                    note=note,
                    source=MessageSource.model_validate(json.loads(source)["source"]),
                )
            return state, answer, status

        return self._s.run(f"read request {request_id}", op)

    def provider_of(self, task_id: str) -> str | None:
        """The provider of the child whose Task waits on a request not yet taken (None:
        it waits on none)."""

        def op(_attempt: int) -> str | None:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._s.sql.approvals.provider_of, (task_id,))
                row = cursor.fetchone()
            return None if row is None else str(row[0])

        return self._s.run(f"read the request of task {task_id}", op)

    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, ApprovalRequest]:
        """The open (unanswered) request of each of these Tasks that waits for one."""
        if not task_ids:
            return {}

        query = _BY_ID.where(_A.state == "open", _A.task_id.in_(list(task_ids)))

        def op(_attempt: int) -> dict[str, ApprovalRequest]:
            with self._db.connection(write=False) as conn:
                return {r.task_id: r.public() for r in map(_stored, conn.execute(query).all())}

        return self._s.run("read approval requests", op)

    def waiting(self) -> list[WaitingRequest]:
        """Every request not yet taken whose Task has not settled, with its child's claim."""

        def op(_attempt: int) -> list[WaitingRequest]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._s.sql.approvals.waiting)
                rows = cursor.fetchall()
            out = []
            for row in rows:
                request = _stored(row[:_STORED_WIDTH])
                state, holder, claim_task = row[_STORED_WIDTH:]
                out.append(WaitingRequest(request, state, holder, claim_task == request.task_id))
            return out

        return self._s.run("read waiting approval requests", op)

    def drain(self, parent_session: str) -> list[StoredRequest]:
        """Take the parent's pending request notices, each once across every runtime: of
        requests still open whose Task still waits."""

        def op(_attempt: int) -> list[str]:
            with self._db.cursor(write=True) as cursor:
                cursor.execute(self._s.sql.approvals.drain, (parent_session,))
                return [row[0] for row in cursor.fetchall()]

        taken = self._s.run(f"drain the request notices of {parent_session}", op)
        if not taken:
            return []
        query = _BY_ID.where(_A.request_id.in_(taken), _A.state == "open")

        def read(_attempt: int) -> list[StoredRequest]:
            with self._db.connection(write=False) as conn:
                rows = map(_stored, conn.execute(query).all())
            return sorted(rows, key=lambda r: r.created_at)

        return self._s.run(f"read the request notices of {parent_session}", read)

    def _request(self, cursor: DBAPICursor, request_id: str) -> tuple[StoredRequest] | None:
        cursor.execute(self._s.sql.approvals.request, (request_id,))
        row = cursor.fetchone()
        return None if row is None else (_stored(row),)


_STORED_WIDTH = 14
_GONE = (None, None, None, None, None)
_A = approvals_table.c
_BY_ID = select(
    _A.request_id, _A.task_id, _A.child_id, _A.parent_session, _A.turn, _A.call_id, _A.tool,
    _A.arguments, _A.reason, _A.pending, _A.parkable, _A.created_at, _A.deadline_at,
    _A.provider,
)  # fmt: skip
"""The request columns `_stored` reads, for the reads that take a list of ids (built with
SQLAlchemy: a list's placeholders are not written by hand)."""


def _stored(row: Sequence[Any]) -> StoredRequest:
    (request_id, task_id, child_id, parent_session, turn, call_id, tool, arguments, reason,
     pending, parkable, created_at, deadline_at, provider) = row  # fmt: skip
    return StoredRequest(
        request_id=request_id,
        task_id=task_id,
        child_id=child_id,
        parent_session=parent_session,
        turn=int(turn),
        call_id=call_id,
        tool=tool,
        arguments=json.loads(arguments),
        reason=reason,
        pending=json.loads(pending),
        parkable=bool(parkable),
        created_at=utc_time(created_at),
        deadline_at=None if deadline_at is None else utc_time(deadline_at),
        provider=provider,
    )


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _unknown(request_id: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.REQUEST_NOT_FOUND,
        f"no approval request {request_id!r} for this session; read the request id from the "
        "task (tasks.get(...).request) or its notice; nothing was changed",
    )


def _closed(request_id: str, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.REQUEST_CLOSED,
        f"approval request {request_id} is closed: {why}; nothing was changed",
    )


def _not_running(task_id: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.CANCELLED,
        f"task {task_id} is no longer running, so it asks nothing; nothing was written",
        task_id=task_id,
    )
