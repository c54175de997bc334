"""Counting what a steer or a resume costs in hand-offs: actor messages and transactions.

Counted, not guessed, in the benchmark process only:

- actor messages: every pykka ``ActorRef.tell`` and ``ActorRef.ask`` (proxy calls go
  through them too), wrapped at the class for the block, labelled by the receiving
  actor's class and the message (a proxy call by its method). A ``tell`` is one
  cross-thread hop, an ``ask`` two (its reply comes back to another thread), whether or not
  the asker waits. Hand-offs that are not pykka messages (a `threading.Event`, a queue of
  our own) are not seen here.
- store calls: `SqlStore.admit_claiming`, ``append``, ``create_child`` and ``load``,
  wrapped at the class, enter the timeline with their start and end.
- store transactions: every statement SQLite runs on the connections opened inside the
  block (``sqlite3`` trace callbacks, installed by a pool ``connect`` listener), grouped
  into transactions: ``BEGIN`` … ``COMMIT``/``ROLLBACK``, or one statement on its own
  outside any (SQLite runs that as a transaction of its own). Each is labelled by what it
  did (``write: events, tasks``, ``read: children, events``).

The counters cost time (a trace callback per statement), so a counting pass is never a
timed one.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pykka
from sqlalchemy import event
from sqlalchemy.pool import Pool

from persistence import SqlStore

__all__ = ["Counts", "counting"]

_VERB = re.compile(r"^\s*(INSERT INTO|UPDATE|DELETE FROM|SELECT|WITH)\b", re.IGNORECASE)
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+(\w+)", re.IGNORECASE)
_WRITES = ("INSERT INTO", "UPDATE", "DELETE FROM")


@dataclass
class Counts:
    """What the block handed off, by label."""

    messages: Counter[str] = field(default_factory=Counter)
    """``tell``/``ask`` to ``Actor``: message → how many."""
    transactions: Counter[str] = field(default_factory=Counter)
    """Transaction label → how many."""
    statements: int = 0
    """Statements in all (``BEGIN``/``COMMIT`` not included)."""
    timeline: list[tuple[float, str]] = field(default_factory=list)
    """(``time.perf_counter()``, what) of each message sent and each transaction's start
    (``BEGIN``, or its one statement) and end (the ``COMMIT`` statement's start), in order."""
    swept: Counter[str] = field(default_factory=Counter)
    """Of `transactions`, those a runtime's own housekeeping threads ran (its heartbeat and
    sweep, lease renewals and watchdog, admission, approvals, wake-up pollers: see
    `_BACKGROUND_THREADS`), not the operation counted: transaction label → how many."""
    swept_statements: int = 0
    """Of `statements`, those the same threads ran."""

    @property
    def tells(self) -> int:
        return sum(n for label, n in self.messages.items() if label.startswith("tell"))

    @property
    def asks(self) -> int:
        return sum(n for label, n in self.messages.items() if label.startswith("ask"))

    @property
    def hops(self) -> int:
        """Cross-thread hops: one per ``tell``, two per ``ask`` (the reply)."""
        return self.tells + 2 * self.asks

    @property
    def writes(self) -> int:
        return sum(n for label, n in self.transactions.items() if label.startswith("write"))

    @property
    def total_transactions(self) -> int:
        return sum(self.transactions.values())

    def snapshot(self) -> Counts:
        """A copy, for taking differences."""
        return Counts(
            Counter(self.messages),
            Counter(self.transactions),
            self.statements,
            list(self.timeline),
            Counter(self.swept),
            self.swept_statements,
        )

    def since(self, earlier: Counts) -> Counts:
        """What was counted after ``earlier`` (a `snapshot`)."""
        return Counts(
            self.messages - earlier.messages,
            self.transactions - earlier.transactions,
            self.statements - earlier.statements,
            self.timeline[len(earlier.timeline) :],
            self.swept - earlier.swept,
            self.swept_statements - earlier.swept_statements,
        )


class _Tracer:
    """Groups one connection's traced statements into labelled transactions."""

    def __init__(self, counts: Counts, lock: threading.Lock) -> None:
        self._counts = counts
        self._lock = lock
        self._open: list[str] | None = None
        self._began = 0.0

    def __call__(self, statement: str) -> None:
        now = time.perf_counter()
        head = statement.lstrip()[:16].upper()
        if head.startswith("BEGIN"):
            self._open, self._began = [], now
            return
        if head.startswith(("COMMIT", "ROLLBACK", "END")):
            done, self._open = self._open or [], None
            self._count(_label(done, rolled_back=head.startswith("ROLLBACK")), self._began, now)
            return
        if head.startswith("PRAGMA"):
            return  # connection set-up
        with self._lock:
            self._counts.statements += 1
            if _in_background():
                self._counts.swept_statements += 1
        if self._open is None:
            self._count(_label([statement]), now, None)
        else:
            self._open.append(statement)

    def _count(self, label: str, began: float, ended: float | None) -> None:
        sweeping = _in_background()
        with self._lock:
            self._counts.transactions[label] += 1
            if sweeping:
                self._counts.swept[label] += 1
            timeline = self._counts.timeline
            if ended is None:
                timeline.append((began, f"statement {label}"))
            else:
                timeline.append((began, f"begin {label}"))
                timeline.append((ended, f"commit {label}"))


def _label(statements: list[str], *, rolled_back: bool = False) -> str:
    written: list[str] = []
    read: list[str] = []
    for statement in statements:
        verb = _VERB.match(statement)
        tables = _TABLE.findall(statement)
        if verb is None or not tables:
            continue
        if verb.group(1).upper() in _WRITES:
            written.append(_short(tables[0]))
        read += [_short(t) for t in tables[1:] if verb.group(1).upper() in _WRITES]
        if verb.group(1).upper() not in _WRITES:
            read += [_short(t) for t in tables]
    kind = "write" if written else "read"
    names = sorted(set(written)) if written else sorted(set(read))
    label = f"{kind}: {', '.join(names) or '?'}"
    return label + (" (rolled back)" if rolled_back else "")


def _short(table: str) -> str:
    return table.removeprefix("subagent_")


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count actor messages and SQLite transactions made inside the block (by any
    thread); the connections must be opened inside it (open the control plane there)."""
    counts = Counts()
    lock = threading.Lock()
    tell, ask = pykka.ActorRef.tell, pykka.ActorRef.ask

    def counted_tell(self: pykka.ActorRef[Any], message: Any) -> None:
        label = f"tell {_message(self, message)}"
        with lock:
            counts.messages[label] += 1
            counts.timeline.append((time.perf_counter(), label))
        tell(self, message)

    def counted_ask(self: pykka.ActorRef[Any], message: Any, **options: Any) -> Any:
        label = f"ask {_message(self, message)}"
        with lock:
            counts.messages[label] += 1
            counts.timeline.append((time.perf_counter(), label))
        return ask(self, message, **options)

    def traced(dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.set_trace_callback(_Tracer(counts, lock))

    originals = {name: getattr(SqlStore, name) for name in _STORE_CALLS}
    for name, method in originals.items():
        setattr(SqlStore, name, _timed(name, method, counts, lock))
    pykka.ActorRef.tell = counted_tell  # type: ignore[method-assign]
    pykka.ActorRef.ask = counted_ask  # type: ignore[method-assign]
    event.listen(Pool, "connect", traced)
    try:
        yield counts
    finally:
        event.remove(Pool, "connect", traced)
        pykka.ActorRef.tell = tell  # type: ignore[method-assign]
        pykka.ActorRef.ask = ask  # type: ignore[method-assign]
        for name, method in originals.items():
            setattr(SqlStore, name, method)


_BACKGROUND_THREADS = (
    "subagent-runtime:",
    "subagent-renewal",
    "subagent-lease-watchdog:",
    "subagent-admission:",
    "subagent-approvals:",
    "subagent-passivator",
    "takeable-poller",
)
"""Name prefixes of a runtime's housekeeping threads: its heartbeat and sweep
(`controlplane.runtime.lease`), lease renewals and watchdog, the admission and approvals
sweeps, the root's passivator and the store's wake-up poller. What they run lands inside a
counted window or not as the scheduler has it."""


def _in_background() -> bool:
    return threading.current_thread().name.startswith(_BACKGROUND_THREADS)


_STORE_CALLS = ("admit_claiming", "append", "create_child", "load")
"""The store calls a steer or a resume makes, timed into the timeline."""


def _timed(name: str, method: Any, counts: Counts, lock: threading.Lock) -> Any:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            ended = time.perf_counter()
            with lock:
                counts.timeline.append((began, f"call store.{name}"))
                counts.timeline.append((ended, f"return store.{name}"))

    return timed


def _message(ref: pykka.ActorRef[Any], message: Any) -> str:
    actor = ref.actor_class.__name__
    path = getattr(message, "attr_path", None)
    if path:  # a proxy call or attribute access: name the method
        return f"{actor}.{'.'.join(path)}"
    return f"{actor} {type(message).__name__}"
