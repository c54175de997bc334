"""What differs between SQLite and PostgreSQL in the store's SQL, decided once per store.

Every statement of the store is written in SQLAlchemy Core from the tables of
`persistence._schema`, in the module of its table (`persistence._children_sql`,
`persistence._task_sql`, …). A store compiles each once, with its `SqlDialect`, to the
driver's own text and placeholders, and runs that text on the raw DBAPI cursor: at a few
microseconds per statement, SQLAlchemy's execution layer would be most of a hot path's
cost. Nothing else in the store knows which database it talks to: row locks, upserts,
notifications and placeholders are this class's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Final

from sqlalchemy import ColumnElement, LargeBinary, Select, Table, bindparam, func, literal_column
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect

__all__ = ["PostgresSql", "SqlDialect", "SqliteSql", "constant", "dialect_named", "params"]


def params(*names: str) -> dict[str, Any]:
    """Bind parameters named ``names``, for ``values(**params(...))``."""
    return {name: bindparam(name) for name in names}


def constant(value: str) -> ColumnElement[Any]:
    """A string constant written into the statement's text (a status a partial index's
    predicate names, so the planner can match it), not bound."""
    if "'" in value or "\\" in value:
        raise ValueError(f"not a plain constant: {value!r}")
    return literal_column("'" + value + "'")


class SqlDialect(ABC):
    """One database's way of writing the store's statements.

    Attributes:
        name: ``sqlite`` or ``postgresql``.
        placeholder: The driver's positional placeholder.
        row_locks: Whether writers lock rows (PostgreSQL) rather than the database admitting
            one writer at a time (SQLite, from ``BEGIN IMMEDIATE``).
        notifies: Whether one session can wake another (LISTEN/NOTIFY): a store watches by
            listening rather than polling, and forwards messages between runtimes.
        server_clock: Whether leases are judged on the database's clock, one for every
            host (else on this host's wall and boot clocks: one host shares the store).
        round_trips: Whether each statement is a round trip over the network, so that one
            data-modifying statement beats two (SQLite's cost none).
        named_sessions: Whether a session is a server process that can bear a name and be
            ended by another (``application_name``, ``pg_terminate_backend``).
        blob_segments: Whether a sealed segment's ``events`` are read as bytes (the JSON
            decoder takes them as stored, where the driver would first decode TEXT).
    """

    name: ClassVar[str]
    placeholder: ClassVar[str]
    row_locks: ClassVar[bool]
    notifies: ClassVar[bool]
    server_clock: ClassVar[bool]
    round_trips: ClassVar[bool]
    named_sessions: ClassVar[bool]
    blob_segments: ClassVar[bool]

    def __init__(self, compiler: Dialect) -> None:
        self._compiler = compiler

    def compile(self, statement: Any, *names: str) -> str:
        """``statement``'s text for this database, its parameters positional.

        ``names`` are its bind parameters in the order the caller passes their values
        (a name once per use); a statement whose compiled order differs is refused here,
        when the store opens, rather than bound wrongly later.
        """
        compiled = statement.compile(dialect=self._compiler)
        order = tuple(compiled.positiontup or ())
        if order != names:
            raise AssertionError(f"statement binds {order}, not {names}: {compiled}")
        return str(compiled)

    def locked(self, query: Select[Any]) -> Select[Any]:
        """``query`` taking the lock that serializes a child's writers on its row."""
        return query

    @abstractmethod
    def insert(self, table: Table) -> Any:
        """An INSERT on ``table`` that can take ``on_conflict_do_update``/``nothing``."""

    def notify(self, channel: Any, payload: Any) -> Any:
        """``NOTIFY channel, payload`` as an expression (SQL expressions both), for a
        database that has notifications; None for one that has none."""
        return None

    @abstractmethod
    def text_tail(self, column: Any, chars: int) -> Any:
        """The last ``chars`` of a text ``column`` (SQLite: of its bytes), as an expression
        that reads no more of a long value than it must."""


class SqliteSql(SqlDialect):
    """SQLite: ``?`` placeholders; one writer at a time, so no row locks."""

    name = "sqlite"
    placeholder = "?"
    row_locks = False
    notifies = False
    server_clock = False
    round_trips = False
    named_sessions = False
    blob_segments = True

    def __init__(self) -> None:
        super().__init__(SQLiteDialect_pysqlite())

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def text_tail(self, column: Any, chars: int) -> Any:
        # The bytes' tail, found without reading the text from its start.
        return func.substr(sql_cast(column, LargeBinary), literal_column(str(-chars)))


class PostgresSql(SqlDialect):
    """PostgreSQL (psycopg): ``%s`` placeholders, row locks, ``pg_notify``."""

    name = "postgresql"
    placeholder = "%s"
    row_locks = True
    notifies = True
    server_clock = True
    round_trips = True
    named_sessions = True
    blob_segments = False

    def __init__(self) -> None:
        # Imported here, not with the module: a process on SQLite alone never pays for
        # the PostgreSQL dialect's import (~90 ms, `tests/test_import_cost.py`).
        from sqlalchemy.dialects.postgresql.base import PGDialect

        # The base dialect, not psycopg's: that one casts every bound value (``%s::VARCHAR``).
        super().__init__(PGDialect(paramstyle="format"))  # type: ignore[no-untyped-call]

    def locked(self, query: Select[Any]) -> Select[Any]:
        # Not FOR UPDATE: the events' foreign-key checks take KEY SHARE on a child's row,
        # which NO KEY UPDATE does not block.
        return query.with_for_update(key_share=True)

    def insert(self, table: Table) -> Any:
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)

    def notify(self, channel: Any, payload: Any) -> Any:
        return func.pg_notify(channel, payload)

    def text_tail(self, column: Any, chars: int) -> Any:
        return func.right(column, literal_column(str(chars)))


_DIALECTS: Final[dict[str, Callable[[], SqlDialect]]] = {
    "sqlite": SqliteSql,
    "postgresql": PostgresSql,
}


def dialect_named(name: str) -> SqlDialect:
    """The dialect of a backend (`persistence._backend.Backend.name`)."""
    return _DIALECTS[name]()
