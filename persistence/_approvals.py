"""Approval requests (SPEC §11): written with their event, answered once, taken once.

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
from persistence._schema import APPROVALS, CHILDREN, TASKS, approvals_table, utc_time
from persistence._task_sql import Fence, TxStep

if TYPE_CHECKING:
    from persistence._store import SqlStore

__all__ = ["Answered", "ApprovalBook", "StoredRequest", "WaitingRequest"]

_INPUT = TaskStatus.INPUT_REQUIRED.value
_RUNNING = TaskStatus.RUNNING.value


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

    def __init__(self, store: SqlStore) -> None:
        self._s = store
        self._db = store._db
        self._sql = _ApprovalSql.build(self._db.sql.placeholder)

    # -- inside an append's transaction --------------------------------------------------

    def asking(self, request: StoredRequest) -> TxStep:
        """The statements that record ``request`` in its event's append: its row, and its
        Task ``input_required`` (a Task no longer running asks nothing: the append fails)."""
        sql, stamp = self._sql, self._s._stamp

        def step(cursor: DBAPICursor) -> None:
            cursor.execute(sql.task_asks, (request.task_id,))
            if cursor.rowcount != 1:
                raise _not_running(request.task_id)
            cursor.execute(
                sql.insert,
                (request.request_id, request.task_id, request.child_id, request.parent_session,
                 request.turn, request.call_id, request.tool, _json(request.arguments),
                 request.reason, _json(request.pending), request.parkable,
                 stamp(request.created_at),
                 None if request.deadline_at is None else stamp(request.deadline_at),
                 request.provider),
            )  # fmt: skip

        return step

    def taking(self, request_id: str, task_id: str) -> TxStep:
        """The statements that take an answer in its ``approval/answer`` event's append:
        the request closed, its Task ``running`` again."""
        sql = self._sql

        def step(cursor: DBAPICursor) -> None:
            cursor.execute(sql.take, (request_id,))
            if cursor.rowcount != 1:
                raise _closed(request_id, "its answer was taken already")
            cursor.execute(sql.task_resumes, (task_id,))

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
        sql = self._sql

        def op(attempt: int) -> Answered:
            with self._db.cursor(write=True) as cursor:
                found = self._request(cursor, request_id)
                if found is None or (session is not None and found[0].parent_session != session):
                    raise _unknown(request_id)
                request = found[0]
                self._s._appends.tail(cursor, request.child_id)  # the child's lock
                cursor.execute(sql.state_of, (request_id,))
                state, answered_by, status, holder, claim_task = cursor.fetchone() or _GONE
                if attempt > 1 and state == "answered" and answered_by == token:
                    return Answered(request, holder)  # our own earlier commit, unheard
                if state != "open":
                    raise _closed(request_id, "it was answered already")
                if status != _INPUT or claim_task != request.task_id:
                    raise _closed(request_id, f"its task {request.task_id} is {status}")
                cursor.execute(
                    sql.answer, (allow, note, token, self._s._stamp(utcnow()), request_id)
                )
                if cursor.rowcount != 1:
                    raise _closed(request_id, "it was answered already")
                # Answered, the Task no longer waits for input: it reads running while its
                # run takes the answer (a `wait` after the answer waits for its outcome).
                cursor.execute(sql.task_resumes, (request.task_id,))
                return Answered(request, holder)

        return self._s._run(f"answer request {request_id}", op)

    def prune(self, before: datetime) -> int:
        """Delete the requests done with before ``before`` (answered then, or asked then
        if never answered): closed (the run took the answer), or whose Task no longer
        runs. The transcript keeps each request and answer; an answer naming a pruned
        request is ``REQUEST_NOT_FOUND``. How many went."""
        p = self._db.sql.placeholder
        live = f"('{_INPUT}', '{_RUNNING}', '{TaskStatus.QUEUED.value}')"
        statement = (
            f"DELETE FROM {APPROVALS} WHERE COALESCE(answered_at, created_at) < {p} AND "
            f"(state = 'closed' OR NOT EXISTS (SELECT 1 FROM {TASKS} t WHERE "
            f"t.task_id = {APPROVALS}.task_id AND t.status IN {live}))"
        )

        def op(_attempt: int) -> int:
            with self._db.cursor(write=True) as cursor:
                cursor.execute(statement, (self._s._stamp(before),))
                return int(cursor.rowcount)

        return self._s._run("prune answered approval requests", op)

    def park(self, request_id: str, child_id: str, fence: Fence) -> bool:
        """Give the child's claim up while ``request_id`` waits (the claim keeps its Task,
        with no runtime; the fencing number grows, so this runtime writes no more). False,
        changing nothing, when the request was answered first: the run takes the answer.

        Raises:
            SubagentControlError: ``FENCED`` when the claim is no longer this runtime's.
        """
        sql = self._sql

        def op(_attempt: int) -> bool:
            with self._db.cursor(write=True) as cursor:
                _last, holder, number = self._s._appends.tail(cursor, child_id)
                cursor.execute(sql.state_only, (request_id,))
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
                cursor.execute(sql.park, (child_id, fence[0], fence[1]))
                return True

        return self._s._run(f"park child {child_id}", op)

    def state(self, request_id: str) -> tuple[ApprovalState, ApprovalAnswer | None, str]:
        """A request's state, its answer once answered, and its Task's status."""

        def op(_attempt: int) -> tuple[ApprovalState, ApprovalAnswer | None, str]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._sql.answer_of, (request_id,))
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

        return self._s._run(f"read request {request_id}", op)

    def provider_of(self, task_id: str) -> str | None:
        """The provider of the child whose Task waits on a request not yet taken (None:
        it waits on none)."""

        def op(_attempt: int) -> str | None:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._sql.provider_of, (task_id,))
                row = cursor.fetchone()
            return None if row is None else str(row[0])

        return self._s._run(f"read the request of task {task_id}", op)

    def of_tasks(self, task_ids: Sequence[str]) -> dict[str, ApprovalRequest]:
        """The open (unanswered) request of each of these Tasks that waits for one."""
        if not task_ids:
            return {}

        query = _BY_ID.where(_A.state == "open", _A.task_id.in_(list(task_ids)))

        def op(_attempt: int) -> dict[str, ApprovalRequest]:
            with self._db.connection(write=False) as conn:
                return {r.task_id: r.public() for r in map(_stored, conn.execute(query).all())}

        return self._s._run("read approval requests", op)

    def waiting(self) -> list[WaitingRequest]:
        """Every request not yet taken whose Task has not settled, with its child's claim."""

        def op(_attempt: int) -> list[WaitingRequest]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._sql.waiting)
                rows = cursor.fetchall()
            out = []
            for row in rows:
                request = _stored(row[:_STORED_WIDTH])
                state, holder, claim_task = row[_STORED_WIDTH:]
                out.append(WaitingRequest(request, state, holder, claim_task == request.task_id))
            return out

        return self._s._run("read waiting approval requests", op)

    def drain(self, parent_session: str) -> list[StoredRequest]:
        """Take the parent's pending request notices, each once across every runtime: of
        requests still open whose Task still waits."""

        def op(_attempt: int) -> list[str]:
            with self._db.cursor(write=True) as cursor:
                cursor.execute(self._sql.drain, (parent_session,))
                return [row[0] for row in cursor.fetchall()]

        taken = self._s._run(f"drain the request notices of {parent_session}", op)
        if not taken:
            return []
        query = _BY_ID.where(_A.request_id.in_(taken), _A.state == "open")

        def read(_attempt: int) -> list[StoredRequest]:
            with self._db.connection(write=False) as conn:
                rows = map(_stored, conn.execute(query).all())
            return sorted(rows, key=lambda r: r.created_at)

        return self._s._run(f"read the request notices of {parent_session}", read)

    def _request(self, cursor: DBAPICursor, request_id: str) -> tuple[StoredRequest] | None:
        cursor.execute(self._sql.request, (request_id,))
        row = cursor.fetchone()
        return None if row is None else (_stored(row),)


_COLUMNS = (
    "r.request_id, r.task_id, r.child_id, r.parent_session, r.turn, r.call_id, r.tool, "
    "r.arguments, r.reason, r.pending, r.parkable, r.created_at, r.deadline_at, r.provider"
)
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


@dataclass(frozen=True, slots=True)
class _ApprovalSql:
    insert: str
    task_asks: str
    take: str
    task_resumes: str
    state_of: str
    state_only: str
    answer: str
    park: str
    answer_of: str
    waiting: str
    drain: str
    provider_of: str
    request: str

    @classmethod
    def build(cls, p: str) -> _ApprovalSql:
        return cls(
            insert=(
                f"INSERT INTO {APPROVALS} (request_id, task_id, child_id, parent_session, turn, "
                "call_id, tool, arguments, reason, pending, parkable, state, created_at, "
                f"deadline_at, provider, notice_pending) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, "
                f"{p}, {p}, {p}, {p}, {p}, 'open', {p}, {p}, {p}, TRUE)"
            ),
            task_asks=(
                f"UPDATE {TASKS} SET status = '{_INPUT}' WHERE task_id = {p} "
                f"AND status IN ('{_RUNNING}', '{_INPUT}')"
            ),
            take=(
                f"UPDATE {APPROVALS} SET state = 'closed', notice_pending = NULL "
                f"WHERE request_id = {p} AND state = 'answered'"
            ),
            task_resumes=(
                f"UPDATE {TASKS} SET status = '{_RUNNING}' WHERE task_id = {p} "
                f"AND status = '{_INPUT}'"
            ),
            state_of=(
                f"SELECT r.state, r.answer_source, t.status, c.claim_runtime, c.claim_task "
                f"FROM {APPROVALS} r JOIN {TASKS} t ON t.task_id = r.task_id "
                f"JOIN {CHILDREN} c ON c.child_id = r.child_id WHERE r.request_id = {p}"
            ),
            state_only=f"SELECT state FROM {APPROVALS} WHERE request_id = {p}",
            answer=(
                f"UPDATE {APPROVALS} SET state = 'answered', allow = {p}, note = {p}, "
                f"answer_source = {p}, answered_at = {p}, notice_pending = NULL "
                f"WHERE request_id = {p} AND state = 'open'"
            ),
            park=(
                f"UPDATE {CHILDREN} SET claim_runtime = NULL, fence = fence + 1 "
                f"WHERE child_id = {p} AND claim_runtime = {p} AND fence = {p}"
            ),
            answer_of=(
                f"SELECT r.state, r.allow, r.note, r.answer_source, t.status FROM {APPROVALS} r "
                f"JOIN {TASKS} t ON t.task_id = r.task_id WHERE r.request_id = {p}"
            ),
            waiting=(
                f"SELECT {_COLUMNS}, r.state, c.claim_runtime, c.claim_task FROM {APPROVALS} r "
                f"JOIN {TASKS} t ON t.task_id = r.task_id "
                f"JOIN {CHILDREN} c ON c.child_id = r.child_id "
                f"WHERE r.state <> 'closed' AND t.status IN ('{_INPUT}', '{_RUNNING}')"
            ),
            request=f"SELECT {_COLUMNS} FROM {APPROVALS} r WHERE r.request_id = {p}",
            provider_of=(
                f"SELECT provider FROM {APPROVALS} WHERE task_id = {p} AND state <> 'closed'"
            ),
            drain=(
                f"UPDATE {APPROVALS} SET notice_pending = NULL WHERE parent_session = {p} "
                "AND notice_pending IS NOT NULL AND state = 'open' AND EXISTS (SELECT 1 FROM "
                f"{TASKS} t WHERE t.task_id = {APPROVALS}.task_id AND t.status = '{_INPUT}') "
                "RETURNING request_id"
            ),
        )


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
