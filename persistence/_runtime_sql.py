"""The raw-cursor statements of the runtime rows (`runtimes_table`) that a claim reads under
a child's lock (`persistence._claims`); the runtimes' own writes are the Task ledger's
(`persistence._ledger`, through SQLAlchemy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, func, select

from persistence._dialect import SqlDialect
from persistence._schema import runtimes_table

__all__ = ["RuntimeStatements", "runtime_table"]

runtime_table: Final = runtimes_table


@dataclass(frozen=True, slots=True)
class RuntimeStatements:
    """The runtime rows' statements, compiled for one database."""

    runtime: str
    """One runtime's lease columns (takes runtime id)."""
    now: str | None
    """The database's clock, where leases are judged by it (PostgreSQL); None where each
    host judges by its own (SQLite)."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> RuntimeStatements:
        r = runtime_table.c
        return cls(
            runtime=dialect.compile(
                select(
                    r.host,
                    r.pid,
                    r.boot_id,
                    r.lease_ttl_s,
                    r.started_at,
                    r.heartbeat_at,
                    r.closed_at,
                    r.heartbeat_boot_s,
                ).where(r.runtime_id == bindparam("runtime_id")),
                "runtime_id",
            ),
            now=dialect.compile(select(func.now())) if dialect.row_locks else None,
        )
