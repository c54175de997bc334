"""``subagent-control children``, ``transcript``, ``tasks`` and ``runtimes``: offline views
of a store, read as it is (`SqlStore` ``read_only``: no table created, no migration). They
never start an actor, and import ``persistence`` only when they run."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from controlplane.cli._exit_status import EXIT_NOT_FOUND, EXIT_USAGE, CommandExit
from controlplane.cli._ids import resolve_id
from controlplane.contract import (
    ErrorCode,
    SessionEvent,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    Usage,
    escape_controls,
    usage_of,
    utcnow,
)

if TYPE_CHECKING:
    from controlplane.contract import LoadedSession
    from persistence import SqlStore

__all__ = ["open_store", "run_children", "run_runtimes", "run_tasks", "run_transcript"]

M = TypeVar("M", bound=BaseModel)


def open_store(url: str, *, write: bool = False) -> SqlStore:
    """The store at ``url``, read as it is (``write``: opened to write, as a runtime would).

    Raises:
        CommandExit: a URL that is not one (usage), a SQLite file that is not there.
    """
    return _open_store(url, write=write)


def _open_store(url: str, *, write: bool = False) -> SqlStore:
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise CommandExit(
            EXIT_USAGE,
            f"--db {url!r} is not a database URL; use e.g. sqlite:///state.db or "
            "postgresql+psycopg://user@host:5432/db",
        )
    sqlite_path = _sqlite_file(url)
    if sqlite_path is not None and not os.path.isfile(sqlite_path):
        # The store would create an empty database there: say the name is wrong instead.
        raise CommandExit(EXIT_NOT_FOUND, f"no SQLite store at {sqlite_path}: check --db")
    from persistence import SqlStore

    # Read as it is: an inspection never creates tables or migrates an older store
    # (a process of that older version may still be using it).
    return SqlStore(url, read_only=not write)


def _sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:///path`` URL names, or None for memory and URI forms."""
    scheme, _, rest = url.partition("://")
    if scheme != "sqlite" and not scheme.startswith("sqlite+"):
        return None
    if not rest.startswith("/"):
        return None
    path = rest[1:].split("?", 1)[0]
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return path


def run_children(args: argparse.Namespace, out: IO[str]) -> None:
    store = _open_store(args.db)
    try:
        children = store.list_children(args.parent)
        # What each spent over all its turns, from its own events.
        spent = {meta.child_id: _spent(store, meta.child_id) for meta in children}
    finally:
        store.close()
    if args.json:
        for meta in children:
            record = meta.model_dump(mode="json") | {
                "usage": spent[meta.child_id].model_dump(mode="json")
            }
            out.write(json.dumps(record) + "\n")
        return
    _write_list(
        out,
        children,
        as_json=False,
        empty=f"(no children{f' of parent {args.parent}' if args.parent else ''})",
        header=("CHILD", "PARENT", "DEPTH", "CREATED", "TOKENS", "CALLS", "COST", "LABEL"),
        row=lambda meta: (
            meta.child_id,
            meta.parent_session,
            str(meta.depth),
            meta.created_at.isoformat(timespec="seconds"),
            *_usage_cells(spent[meta.child_id]),
            meta.label or "",
        ),
    )


def _spent(store: SqlStore, child_id: str) -> Usage:
    try:
        return usage_of(store.load(child_id).own_events)
    except SubagentControlError as exc:
        if exc.code is ErrorCode.CHILD_NOT_FOUND:
            return Usage.zero()  # listed, then gone
        raise


def _usage_cells(usage: Usage) -> tuple[str, str, str]:
    """Tokens (input + output), model calls, and the cost (``-``: no price known)."""
    cost = "-" if usage.cost is None else f"${usage.cost:,.4f}"
    return f"{usage.total_tokens:,}", str(usage.model_calls), cost


def run_tasks(args: argparse.Namespace, out: IO[str]) -> None:
    if not getattr(args, "watch", False):
        _write_tasks(args, out)
        return
    # --watch: the list again every --interval, in place on a terminal; elsewhere
    # --iterations frames (default 1), one after another. Ctrl-C ends it.
    terminal = out.isatty()
    frames = args.iterations if args.iterations is not None else (None if terminal else 1)
    shown = 0
    try:
        while frames is None or shown < frames:
            if shown:
                time.sleep(args.interval)
            if terminal:
                out.write(_HOME_AND_CLEAR)
            elif shown:
                out.write("\n")
            out.write(f"tasks at {utcnow().astimezone().strftime('%H:%M:%S')} (Ctrl-C quits)\n")
            _write_tasks(args, out)
            out.flush()
            shown += 1
    except KeyboardInterrupt:
        pass  # the way a watch ends


_HOME_AND_CLEAR = "\x1b[H\x1b[J"


def _write_tasks(args: argparse.Namespace, out: IO[str]) -> None:
    tasks = _sqlite_tasks(args.db, args.owner)
    if tasks is None:
        store = _open_store(args.db)
        try:
            tasks = store.ledger.recent(args.owner) if store.keeps_tasks else []
            tasks = store.queue.with_places(tasks)  # queued ones with their places
            tasks = _with_requests(store, tasks)  # waiting ones with their requests
        finally:
            store.close()
    _write_list(
        out,
        tasks,
        as_json=args.json,
        empty=f"(no tasks{f' of session {args.owner}' if args.owner else ''})",
        header=(
            "TASK",
            "STATUS",
            "OWNER",
            "CHILD",
            "CREATED",
            "RUNTIME",
            "TOKENS",
            "CALLS",
            "COST",
            "LABEL",
        ),
        row=lambda task: (
            task.id,
            _status(task),
            task.owner_session,
            task.child_id or "",
            task.created_at.isoformat(timespec="seconds"),
            task.runtime_id or "",
            *_usage_cells(task.usage),
            task.label,
        ),
    )


def _sqlite_tasks(url: str, owner: str | None) -> list[TaskSnapshot] | None:
    """The Tasks of a SQLite store file read with `sqlite3` alone (no SQLAlchemy: most of
    what opening the store costs the command), or None where that read does not serve
    (`persistence.sqlite_recent_tasks`): then the store is opened."""
    path = _sqlite_file(url)
    if path is None or "?" in url or not os.path.isfile(path):
        return None
    from persistence import sqlite_recent_tasks

    return sqlite_recent_tasks(path, owner)


def _status(task: TaskSnapshot) -> str:
    """A Task's status; a queued one's with its place in the queue (``queued #2``), one
    waiting for an approval answer with the tool it asks for and the request's id, which
    ``answer`` takes (``input_required deploy request=3f2a…``)."""
    if task.request is not None:
        return f"{task.status.value} {task.request.tool} request={task.request.id}"
    if task.queue_position is None:
        return task.status.value
    return f"{task.status.value} #{task.queue_position}"


def _with_requests(store: SqlStore, tasks: list[TaskSnapshot]) -> list[TaskSnapshot]:
    """The Tasks, each waiting one with its approval request (one read, only if one waits)."""
    waiting = [t.id for t in tasks if t.status is TaskStatus.INPUT_REQUIRED]
    if not waiting:
        return tasks
    found = store.approvals.of_tasks(waiting)
    return [t.model_copy(update={"request": found[t.id]}) if t.id in found else t for t in tasks]


def _write_list(
    out: IO[str],
    items: Sequence[M],
    *,
    as_json: bool,
    empty: str,
    header: Sequence[str],
    row: Callable[[M], Sequence[str]],
) -> None:
    """An offline view's records: one JSON object per line, a table, or ``empty``."""
    if as_json:
        for item in items:
            out.write(item.model_dump_json() + "\n")
    elif not items:
        out.write(escape_controls(empty) + "\n")
    else:
        _write_table(out, header, [row(item) for item in items])


def run_runtimes(args: argparse.Namespace, out: IO[str]) -> None:
    from persistence import is_expired

    store = _open_store(args.db)
    try:
        runtimes = store.ledger.runtimes() if store.keeps_tasks else []
        claims = store.ledger.claims() if store.keeps_tasks else {}
        now = store.ledger.lease_now(utcnow())  # SQLite: the host's boot clock too
    finally:
        store.close()
    if args.json:
        for runtime in runtimes:
            held = [
                {"child_id": child, "task_id": task, "fence": fence}
                for child, task, fence in claims.get(runtime.runtime_id, [])
            ]
            record = runtime.model_dump(mode="json") | {
                "alive": not is_expired(runtime, now),
                "claims": held,
            }
            out.write(json.dumps(record) + "\n")
        return
    if not runtimes:
        out.write("(no runtimes)\n")
        return
    rows = [
        (
            runtime.runtime_id,
            "dead" if is_expired(runtime, now) else "alive",
            runtime.host,
            str(runtime.pid),
            runtime.heartbeat_at.isoformat(timespec="seconds"),
            str(runtime.running_tasks),
            " ".join(
                f"{child}@{fence}" for child, _task, fence in claims.get(runtime.runtime_id, [])
            ),
        )
        for runtime in runtimes
    ]
    header = ("RUNTIME", "STATE", "HOST", "PID", "HEARTBEAT", "RUNNING", "HOLDS (CHILD@FENCE)")
    _write_table(out, header, rows)


def run_transcript(args: argparse.Namespace, out: IO[str]) -> None:
    store = _open_store(args.db)
    try:
        session = store.load(resolve_id(store, "child", args.child))
        _write_transcript(session, args.json, out)
        if args.follow:
            _follow(store, session.meta.child_id, session.events[-1].seq if session.events
                    else -1, args, out)  # fmt: skip
    finally:
        store.close()


def _write_transcript(session: LoadedSession, as_json: bool, out: IO[str]) -> None:
    if as_json:
        for event in session.events:
            out.write(event.model_dump_json() + "\n")
        return
    meta = session.meta
    out.write(
        escape_controls(
            f"child {meta.child_id}  parent={meta.parent_session}  depth={meta.depth}"
            f"  created={meta.created_at.isoformat()}  events={len(session.events)}"
            f"  turns={session.last_turn}{_spend_header(usage_of(session.own_events))}"
        )
        + "\n"
    )
    _write_table(out, _EVENT_HEADER, [_event_row(e) for e in session.events])


_EVENT_HEADER = ("SEQ", "TURN", "KIND", "SOURCE", "TEXT")


def _event_row(e: SessionEvent) -> tuple[str, ...]:
    return (str(e.seq), str(e.turn), e.kind, e.source.kind if e.source else "-", _event_text(e))


def _follow(
    store: SqlStore, child_id: str, last_seq: int, args: argparse.Namespace, out: IO[str]
) -> None:
    """Print each event written after ``last_seq`` as it comes, until Ctrl-C."""
    out.flush()
    try:
        while True:
            time.sleep(args.interval)
            fresh = [e for e in store.load(child_id).events if e.seq > last_seq]
            for event in fresh:
                if args.json:
                    out.write(event.model_dump_json() + "\n")
                else:
                    out.write(escape_controls("  ".join(_event_row(event))) + "\n")
                last_seq = event.seq
            if fresh:
                out.flush()
    except KeyboardInterrupt:
        return  # Ctrl-C is how a follow ends: not an error


def _spend_header(usage: Usage) -> str:
    tokens, calls, cost = _usage_cells(usage)
    return f"  tokens={tokens}  model_calls={calls}  tool_calls={usage.tool_calls}  cost={cost}"


def _event_text(event: SessionEvent) -> str:
    """What a person wants to read of an event: its text, else its data as JSON."""
    text = _text_in(event.data)
    if text is None:
        if event.data is None:
            return ""
        text = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    return text


def _text_in(data: Any) -> str | None:
    if isinstance(data, str):
        return data
    if isinstance(data, list) and data and all(_is_text_block(b) for b in data):
        return "".join(block["text"] for block in data)
    if isinstance(data, dict):
        for key in ("content", "message", "prompt", "output", "text"):
            if key in data:
                found = _text_in(data[key])
                if found is not None:
                    return found
    return None


def _is_text_block(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("text"), str)


def _write_table(out: IO[str], header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    # The last column is free text: it is not padded, so long texts do not widen the rest.
    table = [[escape_controls(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
