"""The statements of the spend counters (`SpendRow`) and the soft budget notices
(`SpendNoticeRow`), compiled per database and run on the raw cursor by
`persistence._spend`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, cast

from sqlalchemy import Table, bindparam, literal_column, select, update

from persistence._dialect import SqlDialect, params
from persistence._schema import SpendNoticeRow, SpendRow

__all__ = ["SpendStatements", "spend_table"]

spend_table: Final = cast(Table, SpendRow.__table__)
notice_table: Final = cast(Table, SpendNoticeRow.__table__)

_COUNTERS: Final = ("tokens", "cost", "model_calls", "tool_calls", "seconds")
_NOTICE: Final = (
    "notice_id", "owner_session", "task_id", "child_id", "label", "summary", "created_at",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SpendStatements:
    """The spend ledger's statements, compiled for one database; those that take one row
    per scope of a chain are compiled once per chain length, when first needed."""

    dialect: SqlDialect
    set_budget: str
    warn: str
    notice: str
    noticed: str
    drain: str
    _adds: dict[int, str] = field(default_factory=dict)
    _rides: dict[int, str] = field(default_factory=dict)
    _reads: dict[int, str] = field(default_factory=dict)

    @classmethod
    def build(cls, dialect: SqlDialect) -> SpendStatements:
        s, n = spend_table.c, notice_table.c
        compile_ = dialect.compile
        zero: Any = literal_column("0")
        budget = dialect.insert(spend_table).values(
            scope=bindparam("scope"), **dict.fromkeys(_COUNTERS, zero),
            budget=bindparam("budget"), warned=zero,
        )  # fmt: skip
        budget = budget.on_conflict_do_update(
            index_elements=[s.scope], set_={"budget": budget.excluded.budget, "warned": zero}
        )
        return cls(
            dialect=dialect,
            set_budget=compile_(budget, "scope", "budget"),
            # An UPDATE, not an upsert: a scope with no row has spent nothing stored yet
            # (a child not yet published), and its row must come with its budget.
            warn=compile_(
                update(spend_table)
                .values(warned=literal_column("1"))
                .where(s.scope == bindparam("scope"), s.warned == zero),
                "scope",
            ),
            notice=compile_(notice_table.insert().values(**params(*_NOTICE)), *_NOTICE),
            noticed=compile_(
                select(literal_column("1")).where(n.notice_id == bindparam("notice_id")),
                "notice_id",
            ),
            drain=compile_(
                notice_table.delete()
                .where(n.owner_session == bindparam("owner_session"))
                .returning(n.task_id, n.child_id, n.label, n.summary, n.created_at, n.notice_id),
                "owner_session",
            ),
        )

    def add_all(self, count: int) -> str:
        """One upsert of ``count`` scopes' rows (scope, then `_COUNTERS`, each): one
        statement, one round trip (PostgreSQL runs an ``executemany`` as one round trip
        per row)."""
        found = self._adds.get(count)
        if found is None:
            found = self._adds[count] = self.dialect.compile(
                self._upsert(count), *self._names(count)
            )
        return found

    def riding(self, count: int, event_insert: Any, event_names: tuple[str, ...]) -> str:
        """``event_insert`` (one event's INSERT, taking ``event_names``) and `add_all` of
        ``count`` scopes in one statement, a data-modifying CTE (PostgreSQL)."""
        found = self._rides.get(count)
        if found is None:
            statement = self._upsert(count).add_cte(event_insert.cte("written"))
            found = self._rides[count] = self.dialect.compile(
                statement, *event_names, *self._names(count)
            )
        return found

    def read(self, count: int) -> str:
        """The rows of ``count`` scopes (takes the scopes)."""
        found = self._reads.get(count)
        if found is None:
            s = spend_table.c
            names = [f"scope_{i}" for i in range(count)]
            query = select(
                s.scope, s.tokens, s.cost, s.model_calls, s.tool_calls, s.seconds, s.budget,
                s.warned,
            ).where(s.scope.in_([bindparam(name) for name in names]))  # fmt: skip
            found = self._reads[count] = self.dialect.compile(query, *names)
        return found

    def _upsert(self, count: int) -> Any:
        s = spend_table.c
        rows: list[dict[str, Any]] = [
            {"scope": bindparam(f"scope_{i}"),
             **{name: bindparam(f"{name}_{i}") for name in _COUNTERS},
             "warned": literal_column("0")}
            for i in range(count)
        ]  # fmt: skip
        upsert = self.dialect.insert(spend_table).values(rows)
        grown = {name: s[name] + upsert.excluded[name] for name in _COUNTERS}
        return upsert.on_conflict_do_update(index_elements=[s.scope], set_=grown)

    @staticmethod
    def _names(count: int) -> tuple[str, ...]:
        return tuple(
            name
            for i in range(count)
            for name in (f"scope_{i}", *(f"{counter}_{i}" for counter in _COUNTERS))
        )
