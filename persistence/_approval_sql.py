"""The statements of the approval requests (`approvals_table`), compiled per database and run
on the raw cursor by `persistence._approvals` (and the claims' `parkable` check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import (
    bindparam,
    delete,
    exists,
    func,
    insert,
    null,
    or_,
    select,
    true,
    update,
)

from controlplane.contract import TaskStatus
from persistence._children_sql import child_table
from persistence._dialect import SqlDialect, constant, params
from persistence._schema import approvals_table
from persistence._task_sql import task_table

__all__ = ["ApprovalStatements", "approval_table"]

approval_table: Final = approvals_table

_INPUT = TaskStatus.INPUT_REQUIRED.value
_RUNNING = TaskStatus.RUNNING.value
_INSERT: Final = (
    "request_id", "task_id", "child_id", "parent_session", "turn", "call_id", "tool",
    "arguments", "reason", "pending", "parkable", "created_at", "deadline_at", "provider",
)  # fmt: skip
REQUEST_COLUMNS: Final = _INSERT
"""The columns a stored request is read from, in `persistence._approvals._stored`'s order."""
INSERT_ORDER: Final = (*_INSERT[:7], "provider", *_INSERT[7:13])
"""The parameters of `ApprovalStatements.insert`, in order (the table's)."""


@dataclass(frozen=True, slots=True)
class ApprovalStatements:
    """The approval rows' statements, compiled for one database."""

    insert: str
    take: str
    state_of: str
    state_only: str
    answer: str
    answer_of: str
    waiting: str
    request: str
    provider_of: str
    drain: str
    parkable: str
    """Whether a Task waits on a request its run can be continued from (takes Task id)."""
    prune: str
    """Delete the requests done with before a time (answered then, or asked then if never
    answered): closed, or whose Task no longer runs (takes the time)."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> ApprovalStatements:
        compile_ = dialect.compile
        a = approval_table.c
        r, t, c = approval_table.alias("r"), task_table.alias("t"), child_table.alias("c")
        by_id = a.request_id == bindparam("request_id")
        with_task = r.join(t, t.c.task_id == r.c.task_id)
        with_claim = with_task.join(c, c.c.child_id == r.c.child_id)
        stored = [r.c[name] for name in REQUEST_COLUMNS]
        waits = t.c.status.in_([constant(_INPUT), constant(_RUNNING)])
        not_closed = r.c.state != constant("closed")
        tc = task_table.c
        live = [constant(_INPUT), constant(_RUNNING), constant(TaskStatus.QUEUED.value)]
        runs = exists().where(tc.task_id == a.task_id, tc.status.in_(live))
        return cls(
            prune=compile_(
                delete(approval_table).where(
                    func.coalesce(a.answered_at, a.created_at) < bindparam("before"),
                    or_(a.state == constant("closed"), ~runs),
                ),
                "before",
            ),
            insert=compile_(
                insert(approval_table).values(
                    **params(*_INSERT), state=constant("open"), notice_pending=true()
                ),
                *INSERT_ORDER,
            ),
            take=compile_(
                update(approval_table)
                .values(state=constant("closed"), notice_pending=null())
                .where(by_id, a.state == constant("answered")),
                "request_id",
            ),
            state_of=compile_(
                select(r.c.state, r.c.answer_source, t.c.status, c.c.claim_runtime, c.c.claim_task)
                .select_from(with_claim)
                .where(r.c.request_id == bindparam("request_id")),
                "request_id",
            ),
            state_only=compile_(select(a.state).where(by_id), "request_id"),
            answer=compile_(
                update(approval_table)
                .values(
                    state=constant("answered"),
                    **params("allow", "note", "answer_source", "answered_at"),
                    notice_pending=null(),
                )
                .where(by_id, a.state == constant("open")),
                "allow",
                "note",
                "answer_source",
                "answered_at",
                "request_id",
            ),
            answer_of=compile_(
                select(r.c.state, r.c.allow, r.c.note, r.c.answer_source, t.c.status)
                .select_from(with_task)
                .where(r.c.request_id == bindparam("request_id")),
                "request_id",
            ),
            waiting=compile_(
                select(*stored, r.c.state, c.c.claim_runtime, c.c.claim_task)
                .select_from(with_claim)
                .where(not_closed, waits)
            ),
            request=compile_(
                select(*stored).where(r.c.request_id == bindparam("request_id")), "request_id"
            ),
            provider_of=compile_(
                select(a.provider).where(
                    a.task_id == bindparam("task_id"), a.state != constant("closed")
                ),
                "task_id",
            ),
            drain=compile_(
                update(approval_table)
                .values(notice_pending=null())
                .where(
                    a.parent_session == bindparam("parent_session"),
                    a.notice_pending.is_not(None),
                    a.state == constant("open"),
                    exists()
                    .where(t.c.task_id == a.task_id, t.c.status == constant(_INPUT))
                    .select_from(t),
                )
                .returning(a.request_id),
                "parent_session",
            ),
            parkable=compile_(
                select(r.c.parkable)
                .select_from(with_task)
                .where(r.c.task_id == bindparam("task_id"), not_closed, waits),
                "task_id",
            ),
        )
