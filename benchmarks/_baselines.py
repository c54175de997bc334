"""The raw baselines a steer is compared with, measured in the same process and run.

- a pykka ``ask`` round trip to an echo `ThreadingActor` (one hop there, one back), bare
  or carrying the raw append (or `SqlStore.append`) done on the actor's thread;
- a raw ``sqlite3`` append of one event row: the store's own table definitions (copied
  from its database file), the same pragmas (WAL, ``synchronous=NORMAL``, foreign keys)
  and the same ``BEGIN IMMEDIATE … COMMIT`` write transaction, but one bare ``INSERT``
  (the store also reads the child's highest ``seq`` in that transaction),
  to a random one of as many children as are live;
- a lock-and-dict router: a dict lookup under a lock, ``run.steer``, then the raw append,
  all on the caller's thread — what routing costs without actors.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka

from benchmarks._provider import BenchRun
from controlplane import MessageSource, TextBlock

__all__ = ["EchoActor", "LockDictRouter", "RawAppender"]


class EchoActor(pykka.ThreadingActor):
    """Replies with the message it got; a callable message is run first, on its thread.

    Asking it ``raw_append`` is one pykka ``ask`` carrying one raw append: the SPEC's
    baseline composed in the shape a steer has, where the caller waits while the other
    thread writes (on a VM, a wait that long can let the caller's CPU idle, and waking it
    costs more than a bare ``ask`` shows).
    """

    def on_receive(self, message: Any) -> Any:
        if callable(message):
            return message()
        return message


class RawAppender:
    """Appends one event row per call through a bare ``sqlite3`` connection.

    Rows go to a random one of `grow`'s children, as steers go to a random live child, so
    both sides write at the same spread of places in the events table's primary key.
    """

    def __init__(self, store_db: Path, path: Path) -> None:
        ddl = _store_ddl(store_db)
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        for statement in ddl:
            self._conn.execute(statement)
        self._seqs: dict[str, int] = {}
        self._children: list[str] = []
        self._rng = random.Random(2)
        self._lock = threading.Lock()
        self._source = json.dumps({"kind": "coordinator", "sender_session_id": "bench-parent"})
        self.grow(1)

    def grow(self, count: int) -> None:
        """Have ``count`` children to append to."""
        while len(self._children) < count:
            child_id = str(uuid.uuid4())
            self._conn.execute(
                "INSERT INTO subagent_children (child_id, parent_session, depth, seed_length, "
                "created_batch, created_at) VALUES (?, 'bench-parent', 1, 0, ?, ?)",
                (child_id, uuid.uuid4().hex, _now()),
            )
            self._children.append(child_id)
            self._seqs[child_id] = 0

    def append(self, text: str) -> None:
        """Commit one ``steering/message`` row (thread-safe: one writer at a time)."""
        data = json.dumps({"text": text})
        with self._lock:
            child_id = self._rng.choice(self._children)
            seq = self._seqs[child_id] = self._seqs[child_id] + 1
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT INTO subagent_events (child_id, seq, turn, kind, data, source, "
                "batch_id, created_at) VALUES (?, ?, 1, 'steering/message', ?, ?, ?, ?)",
                (child_id, seq, data, self._source, uuid.uuid4().hex, _now()),
            )
            self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


class LockDictRouter:
    """``child_id → run`` in a dict under a lock; steer and append on the caller's thread."""

    def __init__(self, runs: dict[str, BenchRun], appender: RawAppender) -> None:
        self._lock = threading.Lock()
        self._runs = dict(runs)
        self._appender = appender

    def steer(self, child_id: str, message: Sequence[TextBlock], source: MessageSource) -> None:
        """Route ``message`` to the child's run and record it."""
        with self._lock:
            run = self._runs[child_id]
        assert run.steer is not None
        run.steer(message, source)
        self._appender.append("".join(block.text for block in message))


def _store_ddl(store_db: Path) -> list[str]:
    conn = sqlite3.connect(store_db)
    try:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name LIKE 'subagent_%' "
            "OR (type = 'index' AND tbl_name LIKE 'subagent_%' AND sql IS NOT NULL) "
            "ORDER BY type DESC"  # tables before indexes
        ).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
