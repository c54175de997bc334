"""``subagent-control answer``: a person answers a child's approval request.

The answer is one write to the store (`persistence.ApprovalBook.answer`, as a ``human``
source, which any session may give): the run waiting for it takes it, in whichever runtime
it waits; a parked Task is continued by a live runtime that has its child's provider.
Nothing is started here. ``REQUEST`` is a request's id, or a Task's (or a unique prefix of
either) when that Task waits on exactly one request.
"""

from __future__ import annotations

import argparse
from typing import IO, TYPE_CHECKING

from controlplane.cli._act import user_name
from controlplane.cli._ids import resolve_id
from controlplane.cli._store import open_store
from controlplane.contract import ErrorCode, MessageSource, SubagentControlError

if TYPE_CHECKING:
    from persistence import SqlStore

__all__ = ["run_answer"]


def run_answer(args: argparse.Namespace, out: IO[str]) -> None:
    """Answer request ``args.request`` (``--allow`` or ``--deny``, ``--note``)."""
    who = args.who or f"cli:{user_name()}"
    store = open_store(args.db, write=True)
    try:
        answered = store.approvals.answer(
            _request_of(store, args.request),
            allow=args.allow,
            note=args.note,
            source=MessageSource(kind="human", sender_session_id=who),
            session=None,
        )
    finally:
        store.close()
    request = answered.request
    verdict = "allowed" if args.allow else "denied"
    where = (
        "a live runtime that has its provider continues it"
        if answered.holder is None
        else f"its run in runtime {answered.holder} takes the answer"
    )
    out.write(
        f"request {request.request_id} ({request.tool}) {verdict}; task {request.task_id} of "
        f"child {request.child_id} goes on: {where}\n"
    )


def _request_of(store: SqlStore, text: str) -> str:
    """The request ``text`` names: a request's id (or prefix), else a Task's whose one
    pending request it is."""
    try:
        return resolve_id(store, "request", text)
    except SubagentControlError as not_a_request:
        if not_a_request.code is not ErrorCode.REQUEST_NOT_FOUND:
            raise
        try:
            task_id = resolve_id(store, "task", text)
        except SubagentControlError as exc:
            if exc.code is ErrorCode.TASK_NOT_FOUND:
                raise SubagentControlError(
                    ErrorCode.REQUEST_NOT_FOUND,
                    f"{not_a_request.message}, nor a task with a pending request; "
                    "'tasks --db URL' shows each waiting Task's request=ID",
                ) from None
            raise
    pending = store.approvals.of_tasks([task_id]).get(task_id)
    if pending is None:
        raise SubagentControlError(
            ErrorCode.REQUEST_NOT_FOUND,
            f"task {task_id} waits on no approval request (it is not input_required)",
            task_id=task_id,
        )
    return pending.id
