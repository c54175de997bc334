"""Shared set-up: scratch stores on SQLite and PostgreSQL, seeded children, process figures."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._history import Message, history
from benchmarks._provider import PROVIDER_NAME
from controlplane import ChildMeta, Descriptor, EventKind, NewEvent
from persistence import SqlStore

__all__ = [
    "DEFAULT_PG_URL",
    "PARENT_SESSION",
    "PG_URL_ENV",
    "frozen_gc",
    "pg_schema",
    "pg_server",
    "proc_status",
    "scratch_dir",
    "seed_child",
    "sqlite_url",
    "transcript_events",
    "write_batches",
]

PG_URL_ENV = "SUBAGENT_CONTROL_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PARENT_SESSION = "bench-parent"


@contextlib.contextmanager
def scratch_dir(keep: bool = False) -> Iterator[Path]:
    """A temporary directory for the benchmark's SQLite files."""
    path = Path(tempfile.mkdtemp(prefix="subagent-bench-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Move every object alive now out of the collector's reach for the block.

    A full collection walks every tracked object in the process: without this, a restore
    that happens to trigger one also pays for the benchmark's own objects (the rivals'
    imported libraries, 1,000 live children), and the spread says more about which run
    hit a collection than about the code measured.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def sqlite_url(path: Path) -> str:
    """The store URL of a SQLite file."""
    return f"sqlite:///{path}"


def pg_server() -> tuple[str, str] | tuple[None, str]:
    """``(url, server version)`` of the PostgreSQL server to use, or ``(None, why not)``."""
    url = os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL
    try:
        import psycopg

        with psycopg.connect(_libpq(url), connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except Exception as exc:
        return None, f"PostgreSQL at {url} is unreachable ({type(exc).__name__}: {exc})"
    return url, str(row[0]).split()[0] if row else "?"


@contextlib.contextmanager
def pg_schema(base_url: str) -> Iterator[str]:
    """A store URL whose search_path is a fresh schema, dropped afterwards."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def transcript_events(messages: tuple[Message, ...]) -> list[NewEvent]:
    """A child's transcript as the control plane and a provider write it.

    Each turn: ``turn/start``, the user message, (turn 1 only) the descriptor, the
    assistant messages, ``turn/end``. So the store holds the messages plus two framing
    events per turn — more rows than the rivals, which store the messages alone.
    """
    descriptor = Descriptor(provider=PROVIDER_NAME).to_event_data()
    user_source = {"kind": "user"}
    events: list[NewEvent] = []
    turn = 0
    for message in messages:
        if message.role == "user":
            if turn:
                events.append(_event(EventKind.TURN_END, turn, _end(turn)))
            turn += 1
            events.append(_event(EventKind.TURN_START, turn, _start(turn)))
            events.append(
                NewEvent.model_validate(
                    {
                        "kind": EventKind.USER_MESSAGE,
                        "turn": turn,
                        "data": {"text": message.text},
                        "source": user_source,
                    }
                )
            )
            if turn == 1:
                events.append(_event(EventKind.DESCRIPTOR, turn, descriptor))
        else:
            events.append(_event(EventKind.ASSISTANT_MESSAGE, turn, {"text": message.text}))
    if turn:
        events.append(_event(EventKind.TURN_END, turn, _end(turn)))
    return events


def seed_child(store: SqlStore, n_messages: int, *, parent_session: str = PARENT_SESSION) -> str:
    """Create a resumable child whose transcript holds ``n_messages`` messages; its id.

    Written in the batches a real child's transcript is written in (`write_batches`), so
    rows carry the timestamps they would (one per write, not one per bulk insert).
    """
    child_id = str(uuid.uuid4())
    first, *rest = write_batches(transcript_events(history(n_messages)))
    store.create_child(ChildMeta(child_id=child_id, parent_session=parent_session, depth=1), first)
    for batch in rest:
        store.append(child_id, batch)
    return child_id


def write_batches(events: list[NewEvent]) -> list[list[NewEvent]]:
    """``events`` grouped as the control plane and a provider write them: a turn's frame
    (``turn/start``, the prompt, the descriptor in turn 1) at publication, then each
    message the child produces, then ``turn/end``."""
    batches: list[list[NewEvent]] = []
    for event in events:
        joins_frame = event.kind in (EventKind.USER_MESSAGE, EventKind.DESCRIPTOR)
        if joins_frame and batches and batches[-1][0].kind == EventKind.TURN_START:
            batches[-1].append(event)
        else:
            batches.append([event])
    return batches


def proc_status() -> dict[str, int]:
    """This process's resident memory (bytes) and thread count, from /proc/self/status."""
    out = {"rss": 0, "threads": 0}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    return out


def _event(kind: str, turn: int, data: Any) -> NewEvent:
    return NewEvent(kind=kind, turn=turn, data=data)


def _start(turn: int) -> dict[str, Any]:
    return {
        "task_id": f"task-{turn}",
        "activation": "initial" if turn == 1 else "resumed",
        "label": "bench",
    }


def _end(turn: int) -> dict[str, Any]:
    return {"task_id": f"task-{turn}", "status": "completed"}
