"""The statements of the spend counters (`spend_table`) and the soft budget notices
(`spend_notices_table`), compiled per database and run on the raw cursor by
`persistence._spend`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import String, bindparam, case, exists, literal_column, select, update
from sqlalchemy import cast as sql_cast

from persistence._dialect import SqlDialect, constant, params
from persistence._schema import children_table, spend_notices_table
from persistence._schema import spend_table as _spend_table

__all__ = ["SpendStatements", "scopes_like", "spend_table"]

spend_table: Final = _spend_table
notice_table: Final = spend_notices_table

_COUNTERS: Final = ("tokens", "cost", "model_calls", "tool_calls", "seconds")
_NOTICE: Final = (
    "notice_id", "owner_session", "task_id", "child_id", "label", "summary", "created_at",
)  # fmt: skip


def _chain_spend() -> Any:
    """`SpendStatements.chain_spend`: ``up`` walks the parents, ``named`` says of each
    whether it is a child (else it is the session, the chain's top)."""
    c, k, s = children_table.alias("c"), children_table.alias("k"), spend_table.alias("s")
    start: Any = select(
        sql_cast(bindparam("child_id"), String(200)).label("id"),
        literal_column("0").label("depth"),
    )
    up: Any = start.cte("up", recursive=True)
    up = up.union_all(
        select(c.c.parent_session, up.c.depth + literal_column("1"))
        .select_from(up.join(c, c.c.child_id == up.c.id))
        .where(up.c.depth < bindparam("depth"))
    )
    is_child = exists().where(k.c.child_id == up.c.id).label("is_child")
    named = select(up.c.id, up.c.depth, is_child).cte("named")
    kind = case((named.c.is_child, constant("child:")), else_=constant("session:"))
    counters = (s.c[name] for name in _COUNTERS)
    return (
        select(
            named.c.depth,
            named.c.id,
            named.c.is_child,
            s.c.scope,
            *counters,
            s.c.budget,
            s.c.warned,
        )
        .select_from(named.outerjoin(s, s.c.scope == kind.op("||")(named.c.id)))
        .order_by(named.c.depth)
    )


def _row() -> tuple[Any, ...]:
    """A scope's row as `persistence._spend` decodes it: scope, `_COUNTERS`, budget,
    warned."""
    s = spend_table.c
    return (s.scope, *(s[name] for name in _COUNTERS), s.budget, s.warned)


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
    chain_spend: str
    """A child's scope chain and its rows in one statement (takes the child id and the
    deepest chain): each row ``depth, id, is_child`` and the scope's spend row's columns
    (NULL where it has none), from the child up (a resume's check on a plane that has not
    seen the child yet)."""
    _adds: dict[int, str] = field(default_factory=dict)
    _counts: dict[int, str] = field(default_factory=dict)
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
            chain_spend=compile_(_chain_spend(), "child_id", "depth"),
        )

    def add_all(self, count: int) -> str:
        """One upsert of ``count`` scopes' rows (scope, then `_COUNTERS`, each): one
        statement, one round trip (PostgreSQL runs an ``executemany`` as one round trip
        per row). It returns each scope's row as it stands after the add (the columns of
        `read`): what the writer's gate checks its next call against, with no read of
        its own."""
        found = self._adds.get(count)
        if found is None:
            found = self._adds[count] = self.dialect.compile(
                self._upsert(count), *self._names(count)
            )
        return found

    def count_all(self, count: int) -> str:
        """`add_all` without its ``RETURNING``: for a writer that knows the rows already
        (`persistence._spend.SpendLedger.add`)."""
        found = self._counts.get(count)
        if found is None:
            found = self._counts[count] = self.dialect.compile(
                self._upsert(count, returning=False), *self._names(count)
            )
        return found

    def riding(self, count: int, event_insert: Any, event_names: tuple[str, ...]) -> str:
        """``event_insert`` (one event's INSERT, taking ``event_names``) and `add_all` of
        ``count`` scopes in one statement, a data-modifying CTE (PostgreSQL), returning
        what `add_all` returns."""
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
            names = [f"scope_{i}" for i in range(count)]
            query = select(*_row()).where(
                spend_table.c.scope.in_([bindparam(name) for name in names])
            )
            found = self._reads[count] = self.dialect.compile(query, *names)
        return found

    def _upsert(self, count: int, *, returning: bool = True) -> Any:
        s = spend_table.c
        rows: list[dict[str, Any]] = [
            {"scope": bindparam(f"scope_{i}"),
             **{name: bindparam(f"{name}_{i}") for name in _COUNTERS},
             "warned": literal_column("0")}
            for i in range(count)
        ]  # fmt: skip
        upsert = self.dialect.insert(spend_table).values(rows)
        grown = {name: s[name] + upsert.excluded[name] for name in _COUNTERS}
        upsert = upsert.on_conflict_do_update(index_elements=[s.scope], set_=grown)
        return upsert.returning(*_row()) if returning else upsert

    @staticmethod
    def _names(count: int) -> tuple[str, ...]:
        return tuple(
            name
            for i in range(count)
            for name in (f"scope_{i}", *(f"{counter}_{i}" for counter in _COUNTERS))
        )


def scopes_like(prefix: str) -> Any:
    """Every scope row whose name starts with ``prefix`` (``child:``: every child's), its
    counters, budget and warned flag, as `persistence._scope_spend.scope_spend` decodes
    it: a cold read (the console's), built in Core and run through SQLAlchemy."""
    s = spend_table.c
    return select(
        s.scope, s.tokens, s.cost, s.model_calls, s.tool_calls, s.seconds, s.budget, s.warned
    ).where(s.scope.like(f"{prefix}%"))
