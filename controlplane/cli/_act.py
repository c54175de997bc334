"""``subagent-control send`` and ``kill``: the command line acts, as a person.

Each opens a runtime on the store for the length of the command (a `SubagentControl`,
with the providers ``--setup`` or ``--demo`` give it, usually none), acts through the same
calls a harness makes, and closes it:

- ``send CHILD TEXT`` is a person's message (`MessageSource` ``human``) under the child's
  parent session: it steers the running turn, wherever it runs (forwarded on PostgreSQL;
  on SQLite a turn running in another process refuses ``OWNERSHIP_CONFLICT``, naming it),
  or resumes the idle child (``started``). A turn started here runs here when the command
  has the child's provider (``--setup``), so the command waits for it to settle (closing
  would end it) and prints its outcome. Without the provider the message is durable all
  the same: the turn waits, ``queued``, for a runtime with the provider to run it
  (work goes where the provider is), and the command says so and returns.
- ``kill TASK`` kills a Task as its owner session, in whichever runtime runs it, and
  waits (``--timeout``) until it reads settled.
"""

from __future__ import annotations

import argparse
import getpass
import threading
import time
from typing import IO, TYPE_CHECKING

from controlplane.cli._ids import resolve_id
from controlplane.cli._store import open_store
from controlplane.contract import (
    AgentHandle,
    ErrorCode,
    MessageSource,
    SubagentControlError,
    TaskSnapshot,
    TextBlock,
    escape_controls,
    fold_descriptor,
)

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["run_kill", "run_send"]


def run_send(args: argparse.Namespace, out: IO[str]) -> None:
    """Send ``args.text`` to child ``args.child`` as a person."""
    if not args.text.strip():
        raise SubagentControlError(ErrorCode.INVALID_INPUT, "an empty message; say something")
    store = open_store(args.db)
    try:
        child_id = resolve_id(store, "child", args.child)
        loaded = store.load(child_id)
        meta = loaded.meta
        descriptor = fold_descriptor(loaded.own_events)
    finally:
        store.close()
    control = _open(args)
    try:
        parent = control.agents.register(meta.parent_session, depth=max(0, meta.depth - 1))
        who = args.who or f"cli:{user_name()}"
        result = control.send_message(
            parent,
            child_id,
            [TextBlock(text=args.text)],
            source=MessageSource(kind="human", sender_session_id=who),
        )
        out.write(f"{result.route} task {result.task_id} of child {child_id}\n")
        out.flush()
        snapshot = control.tasks.get(result.task_id, requester=parent)
        provider = None if descriptor is None else descriptor.provider
        if result.route == "started" and (
            snapshot.waiting_for is not None  # left for such a runtime already
            or (
                snapshot.runtime_id == control.runtime_id
                and provider is not None
                and provider not in control.providers.names()
            )
        ):
            # Not runnable here: the message is durable, and the turn goes to a runtime
            # with the provider. Closing once it has left this runtime loses nothing.
            left = (
                snapshot
                if snapshot.waiting_for is not None
                else _left_here(control, result.task_id, parent, args.timeout)
            )
            if left.waiting_for is not None:
                out.write(
                    f"the turn waits (queued) for a runtime with provider "
                    f"{left.waiting_for!r}, which runs it; this command has none (give it "
                    "with --setup MODULE:FUNCTION to run it here)\n"
                )
            else:
                out.write(_outcome_line(left))
        elif result.route == "started" and snapshot.runtime_id == control.runtime_id:
            # Its turn runs in this command's runtime: closing now would end it.
            settled = control.tasks.wait(result.task_id, timeout=args.timeout, requester=parent)
            out.write(_outcome_line(settled))
    finally:
        control.close()


def run_kill(args: argparse.Namespace, out: IO[str]) -> None:
    """Kill Task ``args.task`` as its owner session, and wait until it reads settled."""
    store = open_store(args.db)
    try:
        task_id = resolve_id(store, "task", args.task)
        found = store.ledger.get(task_id) if store.keeps_tasks else None
    finally:
        store.close()
    if found is None:
        raise SubagentControlError(
            ErrorCode.TASK_NOT_FOUND, f"no task {task_id} in this store", task_id=task_id
        )
    if found.status.is_terminal:
        out.write(_outcome_line(found, already=True))
        return
    control = _open(args)
    try:
        owner = control.agents.register(found.owner_session)
        control.tasks.kill(task_id, requester=owner)
        out.write(f"kill requested for task {task_id}\n")
        out.flush()
        out.write(_outcome_line(control.tasks.wait(task_id, timeout=args.timeout, requester=owner)))
    finally:
        control.close()


def _left_here(
    control: SubagentControl, task_id: str, parent: AgentHandle, timeout: float | None
) -> TaskSnapshot:
    """The Task once it left this runtime for one with its provider (``queued``, naming
    it) or settled (the store refused to leave it), polled: the hand-off has no event."""
    deadline = time.monotonic() + (600.0 if timeout is None else timeout)
    pause = threading.Event()
    while True:
        snapshot = control.tasks.get(task_id, requester=parent)
        if snapshot.status.is_terminal or snapshot.waiting_for is not None:
            return snapshot
        if time.monotonic() > deadline:
            raise SubagentControlError(
                ErrorCode.TIMEOUT,
                f"task {task_id} is still {snapshot.status.value} here after {timeout}s",
                task_id=task_id,
            )
        pause.wait(0.01)


def _open(args: argparse.Namespace) -> SubagentControl:
    from controlplane.fronts import FrontOptions, open_runtime

    return open_runtime(FrontOptions(db=args.db, parent="", setup=args.setup, demo=args.demo))


def _outcome_line(snapshot: TaskSnapshot, *, already: bool = False) -> str:
    outcome = snapshot.outcome
    said = ""
    if outcome is not None:
        said = outcome.output if outcome.output is not None else (outcome.detail or "")
    when = "already " if already else ""
    return escape_controls(f"task {snapshot.id} {when}{snapshot.status.value}: {said}") + "\n"


def user_name() -> str:
    """The user running the command ("unknown" where the uid has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "unknown"
