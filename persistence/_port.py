"""What the store's parts share: its database, its compiled statements and its retry
policy, behind one small port instead of `SqlStore`'s private members.

`SqlStore` builds one `StorePort` and hands it to each of its parts (the append path,
the claims, the inbox, the admission queue, the approval book); they reach each other
through it too (`StorePort.appends`, `StorePort.spend`, …), set once the store has built
them.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar, cast

from persistence._approval_sql import ApprovalStatements
from persistence._children_sql import ChildStatements
from persistence._dialect import SqlDialect, dialect_named
from persistence._inbox_sql import InboxStatements
from persistence._queue_sql import QueueStatements
from persistence._runtime_sql import RuntimeStatements
from persistence._schema import sqlite_time
from persistence._spend_sql import SpendStatements
from persistence._task_sql import TaskStatements

if TYPE_CHECKING:
    from persistence._appends import Appends
    from persistence._database import Database
    from persistence._inbox import Inbox
    from persistence._ledger import TaskLedger
    from persistence._spend import SpendLedger

__all__ = ["StorePort", "StoreSql", "compiled_sql", "next_batch"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreSql:
    """Every raw-cursor statement of one store, compiled once for its database, one
    bundle per table family (each written in its table's module)."""

    dialect: SqlDialect
    children: ChildStatements
    tasks: TaskStatements
    runtimes: RuntimeStatements
    approvals: ApprovalStatements
    queue: QueueStatements
    spend: SpendStatements
    inbox: InboxStatements | None
    """The forwarding inbox's (PostgreSQL only)."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> StoreSql:
        return cls(
            dialect=dialect,
            children=ChildStatements.build(dialect, blob_segments=dialect.blob_segments),
            tasks=TaskStatements.build(dialect),
            runtimes=RuntimeStatements.build(dialect),
            approvals=ApprovalStatements.build(dialect),
            queue=QueueStatements.build(dialect),
            spend=SpendStatements.build(dialect),
            inbox=InboxStatements.build(dialect) if dialect.notifies else None,
        )

    def before(self, *, segments: bool, spend: bool, recoveries: bool = True) -> StoreSql:
        """These statements for an older store read as it is: without the segments table
        (before version 3), the Task rows' spend (before version 7) or their recoveries
        (before version 12)."""
        if segments and spend and recoveries:
            return self
        return _older(self.dialect.name, segments=segments, spend=spend, recoveries=recoveries)


@functools.cache
def compiled_sql(dialect_name: str) -> StoreSql:
    """The statements of a store on ``dialect_name`` (``sqlite``, ``postgresql``), compiled
    once per process and shared by every store on that database: compiling them all costs
    tens of milliseconds, which a store's opening (a cold resume's) must not pay again."""
    return StoreSql.build(dialect_named(dialect_name))


@functools.cache
def _older(dialect_name: str, *, segments: bool, spend: bool, recoveries: bool) -> StoreSql:
    current = compiled_sql(dialect_name)
    dialect = current.dialect
    children = current.children if segments else current.children.without_segments()
    tasks = (
        current.tasks
        if spend and recoveries
        else TaskStatements.build(dialect, spend=spend, recoveries=recoveries and spend)
    )
    return replace(current, children=children, tasks=tasks)


class StorePort:
    """One store's shared parts, as its helpers use them.

    Attributes:
        db: The store's database (cursors, sessions, its backend).
        read_only: Whether the store was opened for inspection only.
        appends: The write path (`persistence._appends.Appends`).
        spend: The spend ledger.
        inbox: The forwarding inbox (PostgreSQL; None on SQLite).
        ledger: The Task ledger.
    """

    appends: Appends
    spend: SpendLedger
    inbox: Inbox | None
    ledger: TaskLedger

    def __init__(
        self,
        db: Database,
        *,
        run: Callable[[str, Callable[[int], object]], object],
        committed: Callable[[], None],
        read_only: bool,
    ) -> None:
        self.db = db
        self.read_only = read_only
        self._run = run
        self.committed = committed
        """Call right after a write commits (the store's test seam)."""
        self.inbox = None

    @property
    def sql(self) -> StoreSql:
        """The store's compiled statements."""
        return self.db.sql

    @property
    def dialect(self) -> SqlDialect:
        """What differs in SQL between the store's database and the other."""
        return self.db.sql.dialect

    def run(self, action: str, operation: Callable[[int], T]) -> T:
        """Run ``operation(attempt)`` under the store's retry policy (raises ``CLOSED``
        once the store is closed)."""
        return cast(T, self._run(action, operation))

    def stamp(self, when: datetime) -> object:
        """``when`` as the driver takes a timestamp (fixed-width text on SQLite)."""
        return sqlite_time(when) if self.db.backend.text_times else when


class _BatchIds:
    """Batch ids, the idempotency keys of writes: 64 random bits per process, then a
    counter. Unique across processes and restarts, and no write pays for the random
    source (an append is on a steer's critical path). A forked child draws new bits."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._serial = itertools.count(1)

    def __call__(self) -> str:
        # 32 hex characters, the size of the uuid4 hex the column was made for.
        return f"{self._prefix}{next(self._serial):016x}"


next_batch = _BatchIds()
"""A new batch id."""
os.register_at_fork(after_in_child=next_batch.reseed)
