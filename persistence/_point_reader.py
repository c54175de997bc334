"""One connection kept out of the pool for a hot primary-key read, and its cursor.

A Task read by id (`TaskLedger.get`) costs about what its select does only if it skips
the pool (see `PointReader`). A connection kept outside the pool leaves this module to do
what the pool otherwise would: say which thread may use it, drop it after a failed read,
disown it in a forked child, and close it with the engine. That machinery is apart from
the Task rows it reads, so the ledger keeps to its rows.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.pool import PoolProxiedConnection

from persistence._database import Database

__all__ = ["PointReader"]


class PointReader:
    """One connection kept out of the pool for the Tasks' point reads, and its cursor.

    A pooled read pays a checkout and a reset on return, together about as much as the
    primary-key select itself (measured). Reads need no transaction (the driver runs in
    autocommit on both backends), and each read fetches its statement to the end, which
    ends the statement's read snapshot with it: the next read, from any thread, sees
    every commit made before it began (SQLite's WAL readers do not block the writer). The
    driver keeps the statement prepared between reads (sqlite3's statement cache;
    psycopg prepares a statement run often on the server).

    One thread at a time reads here; another one meanwhile takes a pooled connection
    rather than wait, as does a forked process (the connection is its parent's) and an
    in-memory database (one connection, which only the store's lock may use). A failed
    read drops the connection (the retry policy's next attempt opens a new one); the
    store's close disposes of its engine, and the connection goes with it.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._conn: PoolProxiedConnection | None = None
        self._cursor: DBAPICursor | None = None
        self._open = not db.backend.single_connection
        self._inherited = False
        if self._open:
            event.listen(db.engine, "engine_disposed", self._close)
            _READERS.add(self)

    def one(self, statement: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The row of a select that finds at most one, or None."""
        if not (self._open and self._lock.acquire(blocking=False)):
            with self._db.cursor(write=False) as cursor:
                cursor.execute(statement, params)
                rows = cursor.fetchall()
            return rows[0] if rows else None
        try:
            kept = self._cursor
            if kept is None:
                self._conn = self._db.engine.raw_connection()
                kept = self._cursor = self._conn.cursor()
            kept.execute(statement, params)
            rows = kept.fetchall()  # to the end: the statement holds no snapshot after
            return rows[0] if rows else None
        except BaseException:
            # Whatever failed (the database, the connection, an interrupt mid-read), the
            # next read starts on a new connection: this one may be unsound.
            self._drop()
            raise
        finally:
            self._lock.release()

    def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            conn.invalidate()

    def _forked(self) -> None:
        """In a forked child: the connection is the parent's, never to be used or closed
        here (nor the lock, which a thread of the parent may have held)."""
        self._lock = threading.Lock()
        self._open = False
        self._inherited = True

    def _close(self, _engine: Engine) -> None:
        with self._lock:
            self._open = False
            if self._inherited:
                return
            conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            conn.detach()  # closed for good, not handed back to the pool just disposed of
            conn.close()


_READERS: weakref.WeakSet[PointReader] = weakref.WeakSet()


def _after_fork() -> None:
    for reader in list(_READERS):
        reader._forked()


os.register_at_fork(after_in_child=_after_fork)
