"""``subagent-control answer``: a person answers a child's approval request (SPEC §11).

The answer is one write to the store (`persistence.ApprovalBook.answer`, as a ``human``
source, which any session may give): the run waiting for it takes it, in whichever runtime
it waits; a parked Task is continued by a live runtime that has its child's provider.
Nothing is started here.
"""

from __future__ import annotations

import argparse
import getpass
from typing import IO

from controlplane.cli._ids import resolve_id
from controlplane.cli._store import open_store
from controlplane.contract import MessageSource

__all__ = ["run_answer"]


def run_answer(args: argparse.Namespace, out: IO[str]) -> None:
    """Answer request ``args.request`` (``--allow`` or ``--deny``, ``--note``)."""
    who = args.who or f"cli:{_user()}"
    store = open_store(args.db, write=True)
    try:
        answered = store.approvals.answer(
            resolve_id(store, "request", args.request),
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


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "unknown"
