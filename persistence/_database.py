"""One store's way into its database: cursors for the hot paths, connections for the rest."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.pool import PoolProxiedConnection

from controlplane.contract import SubagentControlError
from persistence._backend import WRITE_OPTION, ConnectionSettings, open_engine
from persistence._port import StoreSql, compiled_sql

if TYPE_CHECKING:
    # Typing only: SQLAlchemy 2.0.30, the lowest the store supports, does not have it.
    from sqlalchemy.engine.interfaces import DBAPIModule

__all__ = ["KEPT_READERS", "Database"]

KEPT_READERS = 2
"""How many idle SQLite reader connections a store keeps out of its pool (of the pool's
5 + 10): the threads that read at once on a hot path (a resume's, a steer's sender)."""


class Database:
    """The engine of one store, and this process's share of the database.

    SQLite admits one writer at a time: writers here queue on a lock (fairer and faster
    than sqlite3's sleeping busy handler) and reuse one connection kept out of the pool.
    Other processes still meet the busy timeout, which the retry policy handles. An
    in-memory SQLite database is one connection, so every operation takes the lock.

    A SQLite file's cursor reads reuse connections kept out of the pool too (at most
    `KEPT_READERS` idle at once): the pool's checkout and its return, with the rollback
    that resets a returned connection, cost a read about 20 µs each on these machines,
    more than a short read's statement. A read opens no transaction (the connections
    autocommit) and its cursor is closed before the connection is kept, so a kept reader
    holds no snapshot between reads.
    """

    def __init__(self, url: str, settings: ConnectionSettings) -> None:
        self.engine, self.backend = open_engine(url, settings)
        self.sql: StoreSql = compiled_sql(self.backend.name)
        """The store's statements, compiled once per database kind (`persistence._port`)."""
        self.errors: tuple[type[Exception], ...] = (
            sa_exc.SQLAlchemyError,
            self.engine.dialect.loaded_dbapi.Error,
        )
        """What a failing database raises: SQLAlchemy's errors and the driver's own."""
        self._write_engine = self.engine.execution_options(**{WRITE_OPTION: True})
        self._lock = threading.Lock()
        self._writer: PoolProxiedConnection | None = None
        backend = self.backend
        self._keeps_readers = backend.serialize_writes and not backend.single_connection
        self._readers: list[PoolProxiedConnection] = []  # idle kept readers, newest last
        self._readers_lock = threading.Lock()
        _DATABASES.add(self)

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def connection(self, *, write: bool) -> Iterator[Connection]:
        """A SQLAlchemy connection in one transaction, committed when the block ends."""
        with (
            self._guard(write=write),
            (self._write_engine if write else self.engine).begin() as conn,
        ):
            yield conn

    def cursor(
        self,
        *,
        write: bool,
        abandoned: Callable[[], None] | None = None,
        begin: bool = True,
        short: bool = False,
    ) -> AbstractContextManager[DBAPICursor]:
        """A DBAPI cursor, inside a transaction (committed at the end) when ``write``.

        The hot paths bypass SQLAlchemy's execution layer: its fixed cost per statement is
        larger than the statements themselves. Without ``write`` there is no transaction:
        each statement reads a consistent snapshot on its own. (A class, not a
        ``@contextmanager`` generator: on a one-event append the generator's machinery
        cost more than the store's own work around the SQL.)

        ``abandoned`` is called when a write does not commit (the block raised, or the
        COMMIT failed), after the rollback and before the next writer can come in.

        ``begin=False`` opens no transaction for a write: the block runs one statement
        that commits on its own (SQLite's autocommit), under the same write lock and on
        the same kept writer connection.

        ``short``: a read of a few rows (a budget check's counters, what a kept transcript
        lacks). On a SQLite file it runs on the kept writer's connection when no write
        holds it, never waiting for it: that connection's page cache holds what this
        process wrote last, where a reader's starts cold after every commit of another
        connection (a short read there cost ~20 µs more). A write that comes meanwhile
        waits for the read, which holds the write lock while it runs.
        """
        return _CursorBlock(self, write, abandoned, begin, short)

    def open_reader(self) -> None:
        """Open a second connection now, so that the pool still holds one for reads once
        the first write has taken the connection the store's opening left.

        That first write keeps it out of the pool on SQLite (the kept writer); on
        PostgreSQL the inbox's listener holds one for good. Without this the first read
        after opening (a cold resume's load) would open its own connection on the
        caller's path (0.6-0.9 ms on SQLite). Both stay in the pool, which `close`
        empties. An in-memory database has one connection, shared.
        """
        if self.backend.single_connection:
            return
        held = self.engine.raw_connection()  # the opening's: a second checkout must connect
        try:
            self.engine.raw_connection().close()
        finally:
            held.close()

    def close(self) -> None:
        """Close every connection, the kept writer and readers included."""
        with self._lock:
            writer, self._writer = self._writer, None
        with self._readers_lock:
            readers, self._readers = self._readers, []
            self._keeps_readers = False  # a read still running gives its connection back
        for reader in readers:
            reader.close()
        if writer is not None:
            writer.close()
        self.engine.dispose()

    def _forked(self) -> None:
        """In a forked child: the kept readers are the parent's connections, never to be
        used or closed here (nor the lock, which a thread of the parent may have held)."""
        self._readers_lock = threading.Lock()
        self._readers = []

    def _borrow_writer(self) -> bool:
        """Take the write lock for a short read on the kept writer's connection, if no
        write holds it and the writer exists; whether it was taken."""
        if self._writer is None or not self._lock.acquire(blocking=False):
            return False
        if self._writer is None:  # retired meanwhile: a failed write took it
            self._lock.release()
            return False
        return True

    def _take_reader(self) -> PoolProxiedConnection:
        """An idle kept reader (the one kept last), or a connection from the pool."""
        with self._readers_lock:
            if self._readers:
                return self._readers.pop()
        return self.engine.raw_connection()

    def _keep_reader(self, conn: PoolProxiedConnection) -> None:
        """Keep a reader whose read ended cleanly for the next one; beyond
        `KEPT_READERS` idle ones (or once closing), back to the pool."""
        with self._readers_lock:
            if self._keeps_readers and len(self._readers) < KEPT_READERS:
                self._readers.append(conn)
                return
        conn.close()

    def _guard(self, *, write: bool) -> AbstractContextManager[object]:
        if self.backend.single_connection or (write and self.backend.serialize_writes):
            return self._lock
        return nullcontext()

    def _is_disconnect(self, exc: Exception, conn: PoolProxiedConnection) -> bool:
        if isinstance(exc, sa_exc.SQLAlchemyError):
            return False  # raised by SQLAlchemy itself, which looked after its connection
        return self.engine.dialect.is_disconnect(
            cast("DBAPIModule.Error", exc), conn.dbapi_connection, None
        )

    def _abandon(self, conn: PoolProxiedConnection, *, replace: bool) -> None:
        """Roll back a write transaction that did not commit; with ``replace``, also
        close the connection for good (the kept SQLite writer), so that the next write
        starts on a fresh one rather than on one a failed COMMIT may have left unsound."""
        try:
            conn.rollback()
        except self.errors as exc:
            conn.invalidate(exc)  # a connection that cannot roll back is not reusable
            return
        if replace:
            conn.invalidate()


class _CursorBlock:
    """One use of `Database.cursor`: takes the guard and a connection on entry; on exit
    commits (or rolls back a failed write), keeps or returns the connection, and lets the
    guard go.

    A failed write is rolled back. Our own refusal (`SubagentControlError`) leaves the
    connection in use; anything else that ended the transaction early (a database error,
    an interrupt, a COMMIT that failed on a full disk and left the transaction open) also
    retires the kept SQLite writer, so no later write inherits it. A database error that
    means the connection is gone invalidates it, so the pool never hands it out again.
    """

    __slots__ = (
        "_abandoned",
        "_begin",
        "_borrowed",
        "_conn",
        "_cursor",
        "_db",
        "_dbapi",
        "_guard",
        "_keep",
        "_reader",
        "_write",
    )

    def __init__(
        self,
        db: Database,
        write: bool,
        abandoned: Callable[[], None] | None,
        begin: bool,
        short: bool = False,
    ) -> None:
        self._db = db
        self._write = write
        self._abandoned = abandoned
        self._begin = begin
        self._borrowed = short  # until `__enter__` finds the writer's connection free
        self._cursor: DBAPICursor | None = None

    def __enter__(self) -> DBAPICursor:
        db, write = self._db, self._write
        backend = db.backend
        guard = (
            db._lock if backend.single_connection or (write and backend.serialize_writes) else None
        )
        if guard is not None:
            self._borrowed = False
            guard.acquire()
        elif self._borrowed:
            self._borrowed = db._keeps_readers and db._borrow_writer()
            if self._borrowed:
                guard = db._lock
        try:
            borrowed = self._borrowed
            keep = borrowed or (
                write and backend.serialize_writes and not backend.single_connection
            )
            reader = not write and db._keeps_readers and not borrowed
            writer = db._writer
            if keep and writer is not None:
                conn = writer
            elif reader:
                conn = db._take_reader()
            else:
                conn = db.engine.raw_connection()
        except BaseException:
            if guard is not None:
                guard.release()
            raise
        self._guard, self._keep, self._conn, self._reader = guard, keep, conn, reader
        try:
            # The driver's own connection: the pool's proxy would forward each call.
            dbapi = conn.dbapi_connection
            assert dbapi is not None  # checked out, so connected
            self._dbapi = dbapi
            cursor = self._cursor = dbapi.cursor()
            if write and self._begin:
                cursor.execute(backend.begin_write)
        except BaseException as exc:
            self._end(exc)
            raise
        return cursor

    def __exit__(
        self,
        _type: type[BaseException] | None,
        exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._write:
            conn = self._conn
            if exc is None:
                try:
                    self._dbapi.commit()
                except BaseException as failed:
                    self._db._abandon(conn, replace=self._keep)
                    self._end(failed, abandoned=True)
                    raise
            else:
                # Rolled back; the kept writer is retired too, unless the block raised our
                # own refusal (then the database and the connection are fine).
                self._db._abandon(
                    conn, replace=self._keep and not isinstance(exc, SubagentControlError)
                )
                self._end(exc, abandoned=True)
                return
        self._end(exc)

    def _end(self, exc: BaseException | None, *, abandoned: bool = False) -> None:
        db, conn = self._db, self._conn
        try:
            if abandoned and self._abandoned is not None:
                self._abandoned()
            if isinstance(exc, db.errors) and db._is_disconnect(exc, conn):
                conn.invalidate(exc)  # the pool must not hand this connection out again
        finally:
            try:
                if self._borrowed and self._cursor is not None:
                    # Its statement reset before the writer's next transaction: a read
                    # snapshot held into it could not take the write lock.
                    try:
                        self._cursor.close()
                    except db.errors:
                        conn.invalidate()
                if self._keep and conn.is_valid:
                    db._writer = conn
                elif self._reader and _clean(exc) and conn.is_valid and self._cursor is not None:
                    try:
                        self._cursor.close()  # its statement reset: it holds no snapshot
                    except db.errors:
                        conn.close()
                    else:
                        db._keep_reader(conn)
                else:
                    if conn is db._writer:
                        db._writer = None
                    conn.close()
            finally:
                if self._guard is not None:
                    self._guard.release()


_DATABASES: weakref.WeakSet[Database] = weakref.WeakSet()


def _after_fork() -> None:
    for db in list(_DATABASES):
        db._forked()


os.register_at_fork(after_in_child=_after_fork)


def _clean(exc: BaseException | None) -> bool:
    """Whether a read that ended with ``exc`` left its connection as it found it: it ended,
    or raised our own refusal (a child not found); not a database error or an interrupt."""
    return exc is None or isinstance(exc, SubagentControlError)
