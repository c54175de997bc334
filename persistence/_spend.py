"""What each scope has spent, counted in the store, for budgets.

A scope is a child with everything it started (``child:<id>``) or a top-level parent
session (``session:<id>``). A child's scopes are itself, each ancestor child (its parent
session is its parent's child id) and, at the top, the session that started the first of
them: its chain, read once from the children's headers (which never change) and cached.

The counters grow in the transaction of the append that records the spend: the
``usage`` in the data of the events appended (an ``assistant/message``, a ``tool/result``)
and the seconds a ``turn/end`` carries in (`SqlStore.append`'s ``seconds``), by an upsert
``SET x = x + n`` for every scope of the chain, so concurrent appends in any number of
runtimes never lose a count (SQLite serializes writers; PostgreSQL's row lock does).
That upsert returns each scope's row as it stands after the add, every other runtime's
committed spend included (on SQLite's one kept writer, the ledger works the same rows out
from that connection's own counting while no other connection has committed since, which
``PRAGMA data_version`` tells: a pragma costs less than the returned rows); once the
append has committed, the ledger keeps those rows as the child's newest view
(`SpendLedger.view`), so the child's gate checks its next call
against them without a read of its own (`SpendLedger.read` serves a gate that has no
view newer than its last call). Either way what a gate sees may miss what other
runtimes' calls spent since, which is the overshoot the guide states.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

from sqlalchemy.engine import Connection

from controlplane.contract import (
    USAGE,
    EventKind,
    Spent,
    TaskNotice,
    TaskStatus,
    spent_in,
    usage_counts,
    utcnow,
)
from persistence._children_sql import EVENT_INSERT, EVENT_NAMES
from persistence._codec import PendingEvent
from persistence._database import Database
from persistence._schema import sqlite_time, utc_time

__all__ = [
    "ScopeCounts",
    "ScopeSpend",
    "SpendLedger",
    "child_scope",
    "session_scope",
]

T = TypeVar("T")
Runner = Callable[[str, Callable[[int], Any]], Any]

_MAX_DEPTH: Final = 64
"""A chain longer than this is cut (a cycle in hand-written headers must not loop)."""
_CACHE: Final = 4096


def child_scope(child_id: str) -> str:
    """The scope of a child with everything it started."""
    return f"child:{child_id}"


def session_scope(session_id: str) -> str:
    """The scope of a top-level parent session."""
    return f"session:{session_id}"


Cursor = Any
"""A DBAPI cursor, or `_OnConnection` over a SQLAlchemy connection: ``execute``,
``executemany``, ``fetchone``, ``rowcount``."""


ScopeCounts = tuple[int, float, int, int, float, Any, Any]
"""One scope's row as a gate checks it: its counters (`Spent`'s fields, in order), its
budget (its decoded JSON limits, shared: never changed; None for none) and whether its
soft notice was sent (truthy)."""


@dataclass(frozen=True, slots=True)
class ScopeSpend:
    """One scope's row: its spend, its budget (JSON limits, or None) and whether its soft
    notice was sent."""

    scope: str
    spent: Spent
    budget: dict[str, float] | None
    warned: bool


class SpendLedger:
    """The store's spend counters, budgets and soft notices (`SqlStore.spend`). Reads and
    the budget and notice writes are short transactions of their own, retried by the
    store's policy; the counting rides in the append's (`add`)."""

    def __init__(self, db: Database, run: Runner) -> None:
        self._db = db
        self._runner = run
        dialect = db.sql.dialect
        self._sql = db.sql.spend
        self._text_times = db.backend.text_times
        self._lock = threading.Lock()
        self._chains: dict[str, tuple[str, ...]] = {}
        self._one_trip = dialect.round_trips
        # The rows the last counting upsert returned, per thread, until its append
        # commits (`published`); then per child, with the publication's number.
        self._returned = threading.local()
        self._views: dict[str, tuple[int, Sequence[Any]]] = {}
        self._published = itertools.count(1)
        # SQLite's kept writer (one connection, one writer at a time): the rows as this
        # connection's own counting left them, good while no other connection has
        # committed since (`PRAGMA data_version`); see `add`. Touched under the write lock.
        backend = db.backend
        self._mirrors = backend.serialize_writes and not backend.single_connection
        self._mirror: dict[str, tuple[Any, ...]] = {}
        self._mirror_of: tuple[Any, int] | None = None  # (connection, data_version)

    # -- inside an append's transaction ---------------------------------------------------

    def add(
        self,
        cursor: Cursor,
        child_id: str,
        pending: Sequence[PendingEvent],
        *,
        seconds: float = 0.0,
        kept_writer: bool = False,
    ) -> None:
        """Count what ``pending`` (a child's own events) records, and ``seconds``, for
        every scope of the child, in the caller's transaction. Writes nothing when they
        record no spend.

        ``kept_writer``: the transaction is on the store's one SQLite writer connection
        (`Database.cursor` with ``write``; the caller calls `abandoned` inside it if it
        fails). Then the rows after the add are worked out here when this ledger knows them
        as that connection's own counting left them and no other connection has committed
        since (``PRAGMA data_version`` unchanged): the same rows the upsert's ``RETURNING``
        would give (SQLite runs one writer at a time, and the arithmetic is the same
        floating point), for a pragma that costs a fraction of the returned rows. Anything
        else (another runtime's or connection's commit, a scope not known yet, a budget or
        notice written) takes them from ``RETURNING``.
        """
        row = _counted(pending, seconds)
        if row is None:
            return
        scopes = self._chain(cursor, child_id)
        params = [value for scope in scopes for value in (scope, *row)]
        # A chain runs from the child up to its session, so two appends' chains share their
        # rows in one order (their common ancestors, top-level last): no lock cycle.
        if kept_writer and self._mirrors:
            rows = self._add_mirrored(cursor, scopes, row, params)
        else:
            cursor.execute(self._sql.add_all(len(scopes)), params)
            rows = cursor.fetchall()
        self._returned.rows = (cursor, child_id, rows)

    def _add_mirrored(
        self, cursor: Cursor, scopes: tuple[str, ...], row: tuple[Any, ...], params: list[Any]
    ) -> Sequence[Any]:
        cursor.execute("PRAGMA data_version")
        version = cursor.fetchone()[0]
        connection = cursor.connection
        mirror = self._mirror
        known = self._mirror_of
        if known is None or known[0] is not connection or known[1] != version:
            mirror.clear()  # another connection committed: any row may have moved
            self._mirror_of = (connection, version)
        elif all(scope in mirror for scope in scopes):
            cursor.execute(self._sql.count_all(len(scopes)), params)
            rows = []
            for scope in scopes:
                was = mirror[scope]
                now = (
                    scope, was[1] + row[0], was[2] + row[1], was[3] + row[2],
                    was[4] + row[3], was[5] + row[4], was[6], was[7],
                )  # fmt: skip
                mirror[scope] = now
                rows.append(now)
            return rows
        cursor.execute(self._sql.add_all(len(scopes)), params)
        returned: Sequence[Any] = cursor.fetchall()
        if len(mirror) >= _CACHE:
            mirror.clear()
        for found in returned:
            mirror[found[0]] = tuple(found)
        return returned

    def abandoned(self) -> None:
        """A kept writer's transaction did not commit (called once it is rolled back, under
        the write lock): what `add` worked out from it is forgotten."""
        self._forget()

    def _forget(self) -> None:
        self._mirror.clear()
        self._mirror_of = None

    def insert_counting(
        self,
        cursor: Cursor,
        child_id: str,
        event: PendingEvent,
        row: Sequence[Any],
        seconds: float = 0.0,
    ) -> bool:
        """PostgreSQL: insert one event (`ChildStatements.insert`'s ``row``) and count what it
        spent in one statement, a data-modifying CTE: one round trip, not two, on the path of every
        model call's append. False (nothing done) on SQLite, where a statement costs no
        round trip, and for an event that records no spend: the caller inserts it itself
        and calls `add`."""
        if not self._one_trip:
            return False
        spent = spent_in([event.data], seconds)
        if spent is None:
            return False
        scopes = self._chain(cursor, child_id)
        statement = self._sql.riding(len(scopes), EVENT_INSERT, EVENT_NAMES)
        counts = (spent.tokens, spent.cost, spent.model_calls, spent.tool_calls, spent.seconds)
        cursor.execute(statement, [*row, *(v for scope in scopes for v in (scope, *counts))])
        self._returned.rows = (cursor, child_id, cursor.fetchall())
        return True

    @staticmethod
    def records_spend(pending: Sequence[PendingEvent], seconds: float = 0.0) -> bool:
        """Whether `add` would count anything for ``pending`` and ``seconds``."""
        return _counted(pending, seconds) is not None

    def published(self, cursor: Cursor) -> None:
        """The append that ran on ``cursor`` has committed: the rows its `add` (or
        `insert_counting`) returned become its child's newest view. Called after every
        append's commit; one that counted nothing publishes nothing, and rows another
        transaction returned (a failed attempt's, a creation's) are never published."""
        returned = getattr(self._returned, "rows", None)
        if returned is None:
            return
        self._returned.rows = None
        written_by, child_id, rows = returned
        if written_by is not cursor:
            return
        number = next(self._published)
        with self._lock:
            if len(self._views) >= _CACHE and child_id not in self._views:
                self._views.clear()  # a gate without a view reads the counters
            self._views[child_id] = (number, rows)

    def newest(self, child_id: str) -> int:
        """The number of the child's newest view (0: none), for `view`'s ``after``."""
        found = self._views.get(child_id)
        return 0 if found is None else found[0]

    def view(self, child_id: str, after: int) -> tuple[int, dict[str, ScopeCounts]] | None:
        """The child's newest view if it was published after number ``after`` (0: any),
        with its number: every scope of its chain, as the child's last committed append
        that counted spend left them (`ScopeCounts`: a gate reads one per call, so no
        `ScopeSpend` or `Spent` is built for it)."""
        found = self._views.get(child_id)
        if found is None or found[0] <= after:
            return None
        number, rows = found
        return number, {
            row[0]: (row[1], row[2], row[3], row[4], row[5], _limits(row[6]), row[7])
            for row in rows
        }

    def created(self, cursor: Cursor, child_id: str, pending: Sequence[PendingEvent]) -> None:
        """A new child's budget, from its descriptor among ``pending``, in the transaction
        that writes its header."""
        for event in pending:
            if event.kind == EventKind.DESCRIPTOR and isinstance(event.data, dict):
                budget = event.data.get("budget")
                if isinstance(budget, dict) and budget:
                    cursor.execute(self._sql.set_budget, (child_scope(child_id), _dumps(budget)))

    @staticmethod
    def on_connection(conn: Connection) -> Cursor:
        """A cursor over a SQLAlchemy connection's transaction (`SqlStore.create_child`)."""
        return _OnConnection(conn)

    # -- the gate's reads and writes -----------------------------------------------------

    def scopes(self, child_id: str) -> tuple[str, ...]:
        """The scopes of a stored child: itself, each ancestor child, the session."""

        def op(_attempt: int) -> tuple[str, ...]:
            with self._db.cursor(write=False) as cursor:
                return self._chain(cursor, child_id)

        return self._run(f"read the scopes of child {child_id}", op)

    def scopes_under(self, parent_session: str) -> tuple[str, ...]:
        """The scopes above a child of ``parent_session`` (a session, or a child's id)."""

        def op(_attempt: int) -> tuple[str, ...]:
            with self._db.cursor(write=False) as cursor:
                return self._above(cursor, parent_session)

        return self._run(f"read the scopes of session {parent_session}", op)

    def parent_of(self, child_id: str) -> str | None:
        """A stored child's parent session; None for a child the store does not have."""

        def op(_attempt: int) -> str | None:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._db.sql.children.parent, (child_id,))
                row = cursor.fetchone()
            return None if row is None else str(row[0])

        return self._run(f"read the parent of child {child_id}", op)

    def read(self, scopes: Sequence[str]) -> dict[str, ScopeSpend]:
        """The rows of ``scopes`` (a scope that spent nothing and has no budget has none)."""
        statement = self._sql.read(len(scopes))

        def op(_attempt: int) -> dict[str, ScopeSpend]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(statement, tuple(scopes))
                rows = cursor.fetchall()
            return {str(row[0]): _scope_spend(row) for row in rows}

        return self._run("read the spend", op)

    def chain_and_rows(
        self, child_id: str, parent_session: str
    ) -> tuple[tuple[str, ...], dict[str, ScopeSpend]]:
        """A gate's first read: the scopes of ``child_id`` (a child of ``parent_session``,
        stored or not yet) and their rows; one statement unless the child is not stored
        yet (its first turn, unpublished)."""
        scopes, rows = self.chain_spend(child_id)
        if len(scopes) > 1:  # stored: a chain ends with its session
            return scopes, rows
        scopes = (child_scope(child_id), *self.scopes_under(parent_session))
        return scopes, self.read(scopes)

    def chain_spend(self, child_id: str) -> tuple[tuple[str, ...], dict[str, ScopeSpend]]:
        """`scopes` and `read` of them, in one statement (one round trip, one snapshot)
        when the chain is not known yet: a resume's budget check on a fresh plane."""
        chain = self._chains.get(child_id)
        if chain is not None:
            return chain, self.read(chain)

        def op(_attempt: int) -> tuple[tuple[str, ...], dict[str, ScopeSpend]]:
            with self._db.cursor(write=False) as cursor:
                cursor.execute(self._sql.chain_spend, (child_id, _MAX_DEPTH))
                rows = cursor.fetchall()
            scopes: list[str] = []
            found: dict[str, ScopeSpend] = {}
            for depth, name, is_child, *spend in rows:
                if spend[0] is not None:
                    found[str(spend[0])] = _scope_spend(spend)
                if not is_child:
                    if depth > 0:  # the top: a session (a child not stored has none)
                        scopes.append(session_scope(str(name)))
                    break
                scopes.append(child_scope(str(name)))
            if not scopes:  # not stored (yet): its own scope only, as `scopes` says
                return (child_scope(child_id),), {}
            self._remember(child_id, tuple(scopes))
            return tuple(scopes), found

        return self._run(f"read the spend of child {child_id}", op)

    def set_budget(self, child_id: str, limits: dict[str, float] | None) -> None:
        """Replace a child's budget (None: no budget); its spend stays, and its soft
        notice may be sent again."""
        params = (child_scope(child_id), None if limits is None else _dumps(limits))

        def op(_attempt: int) -> None:
            with self._db.cursor(write=True) as cursor:
                self._forget()  # a row's budget and notice change outside `add`
                cursor.execute(self._sql.set_budget, params)

        self._run(f"set the budget of child {child_id}", op)

    def warn(self, scope: str, notice: tuple[str, str, str | None, str, str]) -> bool:
        """Mark ``scope`` warned and queue its notice (owner, Task id, child id, label,
        summary) in one transaction, unless it was warned already; whether this call did.

        A notice for a child other than the gate's names that child's running Task when
        it has one (its claim's): the Task id is the given one otherwise."""
        owner, task_id, child_id, label, summary = notice
        notice_id = uuid.uuid4().hex

        def op(attempt: int) -> bool:
            with self._db.cursor(write=True) as cursor:
                self._forget()  # a row's notice changes outside `add`
                if attempt > 1:  # our earlier attempt may have committed unheard
                    cursor.execute(self._sql.noticed, (notice_id,))
                    if cursor.fetchone() is not None:
                        return True
                cursor.execute(self._sql.warn, (scope,))
                if cursor.rowcount != 1:
                    return False
                task, name = self._task_of(cursor, child_id, task_id, label)
                stamp = sqlite_time(utcnow()) if self._text_times else utcnow()
                cursor.execute(
                    self._sql.notice, (notice_id, owner, task, child_id, name, summary, stamp)
                )
                return True

        result: bool = self._run(f"warn of the budget of {scope}", op)
        return result

    def drain(self, owner_session: str) -> list[tuple[datetime, TaskNotice]]:
        """Take the owner's soft budget notices, each once across every runtime."""

        def op(_attempt: int) -> list[tuple[datetime, TaskNotice]]:
            with self._db.cursor(write=True) as cursor:
                cursor.execute(self._sql.drain, (owner_session,))
                rows = cursor.fetchall()
            return [
                (
                    utc_time(created),
                    TaskNotice(
                        task_id=task_id,
                        child_id=child_id,
                        label=label,
                        status=TaskStatus.RUNNING,
                        summary=summary,
                    ),
                )
                for task_id, child_id, label, summary, created, _id in rows
            ]

        return self._run("drain budget notices", op)

    # -- plumbing ---------------------------------------------------------------------

    def _task_of(
        self, cursor: Cursor, child_id: str | None, task_id: str, label: str
    ) -> tuple[str, str]:
        if child_id is None:
            return task_id, label
        cursor.execute(self._db.sql.children.claim_task, (child_id,))
        row = cursor.fetchone()
        if row is None or row[0] is None or row[0] == task_id:
            return task_id, label
        cursor.execute(self._db.sql.tasks.label, (row[0],))
        named = cursor.fetchone()
        return str(row[0]), str(named[0]) if named is not None else label

    def _chain(self, cursor: Cursor, child_id: str) -> tuple[str, ...]:
        chain = self._chains.get(child_id)
        if chain is not None:
            return chain
        cursor.execute(self._db.sql.children.parent, (child_id,))
        row = cursor.fetchone()
        if row is None:  # not stored (yet): its own scope only
            return (child_scope(child_id),)
        chain = (child_scope(child_id), *self._above(cursor, str(row[0])))
        self._remember(child_id, chain)
        return chain

    def _above(self, cursor: Cursor, session: str) -> tuple[str, ...]:
        """The scopes of ``session``: a child's own chain, or a top-level session's scope."""
        chain: list[str] = []
        current = session
        for _ in itertools.repeat(None, _MAX_DEPTH):
            known = self._chains.get(current)
            if known is not None:
                return (*chain, *known)
            cursor.execute(self._db.sql.children.parent, (current,))
            row = cursor.fetchone()
            if row is None:
                chain.append(session_scope(current))
                break
            chain.append(child_scope(current))
            current = str(row[0])
        return tuple(chain)

    def _remember(self, child_id: str, chain: tuple[str, ...]) -> None:
        with self._lock:
            if len(self._chains) >= _CACHE:
                self._chains.clear()  # rebuilt on demand: a header never changes
            self._chains[child_id] = chain

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        result: T = self._runner(action, operation)
        return result


def _counted(pending: Sequence[PendingEvent], seconds: float) -> tuple[Any, ...] | None:
    """What ``pending`` and ``seconds`` add to each scope (`Spent`'s fields, in order), as
    `spent_in` counts it; None for nothing. One event (a model call's reply, a tool's
    result: every call's append) is read here without building a `Spent`."""
    if len(pending) != 1:
        spent = spent_in([event.data for event in pending], seconds)
        if spent is None:
            return None
        return (spent.tokens, spent.cost, spent.model_calls, spent.tool_calls, spent.seconds)
    data = pending[0].data
    counts = usage_counts(data.get(USAGE)) if isinstance(data, dict) else None
    if counts is None:
        return (0, 0.0, 0, 0, float(seconds)) if seconds else None
    cost = 0.0 if counts[6] is None else 0.0 + counts[6]
    return (counts[0] + counts[1], cost, counts[4], counts[5], float(seconds))


_LIMITS: dict[str, Any] = {}
"""Stored budgets decoded, by their JSON: a gate decodes its scopes' rows before each call,
and a budget is rarely replaced. The dicts are shared: read them, never change them."""


def _limits(budget: str | None) -> Any:
    if not budget:
        return None
    found = _LIMITS.get(budget)
    if found is None:
        if len(_LIMITS) >= _CACHE:
            _LIMITS.clear()
        found = _LIMITS[budget] = json.loads(budget)
    return found


def _scope_spend(row: Sequence[Any]) -> ScopeSpend:
    scope, tokens, cost, model_calls, tool_calls, seconds, budget, warned = row
    limits = _limits(budget)
    return ScopeSpend(
        scope=str(scope),
        spent=Spent(int(tokens), float(cost), int(model_calls), int(tool_calls), float(seconds)),
        budget=limits if isinstance(limits, dict) else None,
        warned=bool(warned),
    )


def _dumps(limits: dict[str, Any]) -> str:
    return json.dumps(limits, sort_keys=True)


class _OnConnection:
    """`Cursor` over a SQLAlchemy `Connection` (the driver's own SQL and placeholders)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._result: Any = None

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        self._result = self._conn.exec_driver_sql(sql, tuple(params))
        return self._result

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any:
        return self._conn.exec_driver_sql(sql, [tuple(row) for row in rows])

    def fetchone(self) -> Any:
        return self._result.fetchone()

    def fetchall(self) -> Any:
        return self._result.fetchall()

    @property
    def rowcount(self) -> int:
        return int(self._result.rowcount)
