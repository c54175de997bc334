"""A spending scope as the spend ledger (`persistence._spend`) reads and writes it: its
name (``child:<id>``, ``session:<id>``), its row decoded (`ScopeSpend`, `ScopeCounts`), what
an append adds to it, its budget's JSON, and the cursor the ledger runs its statements on.
Apart from the ledger because the console's overview (`persistence._overview`) decodes the
same rows, and these hold no state of the ledger's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.engine import Connection

from controlplane.contract import USAGE, Spent, spent_in, usage_counts
from persistence._codec import PendingEvent

__all__ = [
    "CACHE",
    "Cursor",
    "OnConnection",
    "ScopeCounts",
    "ScopeSpend",
    "child_scope",
    "counted",
    "dump_limits",
    "limits_of",
    "scope_spend",
    "session_scope",
]


CACHE: Final = 4096
"""How many entries a cache of the ledger's (chains, views, budgets) holds before it is cleared."""


def child_scope(child_id: str) -> str:
    """The scope of a child with everything it started."""
    return f"child:{child_id}"


def session_scope(session_id: str) -> str:
    """The scope of a top-level parent session."""
    return f"session:{session_id}"


Cursor = Any
"""A DBAPI cursor, or `OnConnection` over a SQLAlchemy connection: ``execute``,
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


def counted(pending: Sequence[PendingEvent], seconds: float) -> tuple[Any, ...] | None:
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


def limits_of(budget: str | None) -> Any:
    if not budget:
        return None
    found = _LIMITS.get(budget)
    if found is None:
        if len(_LIMITS) >= CACHE:
            _LIMITS.clear()
        found = _LIMITS[budget] = json.loads(budget)
    return found


def scope_spend(row: Sequence[Any]) -> ScopeSpend:
    scope, tokens, cost, model_calls, tool_calls, seconds, budget, warned = row
    limits = limits_of(budget)
    return ScopeSpend(
        scope=str(scope),
        spent=Spent(int(tokens), float(cost), int(model_calls), int(tool_calls), float(seconds)),
        budget=limits if isinstance(limits, dict) else None,
        warned=bool(warned),
    )


def dump_limits(limits: dict[str, Any]) -> str:
    return json.dumps(limits, sort_keys=True)


class OnConnection:
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
