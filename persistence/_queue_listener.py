"""The admission queue's listener: a runtime hears every release of a concurrency slot on
the store (PostgreSQL ``LISTEN``), so a Task waiting there tries at once, not at its next
poll. The same listener, on another channel, hears that a Task can be taken
(`persistence._takeable`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from persistence._queue_sql import CHANNEL

if TYPE_CHECKING:
    from persistence._database import Database

__all__ = ["AdmissionListener"]

log = logging.getLogger(__name__)


class AdmissionListener:
    """One thread with its own connection listening on ``channel`` (PostgreSQL; `CHANNEL`
    by default), calling ``on_release()`` for each notification (reconnecting if the
    connection drops: a release missed meanwhile only waits for the next poll)."""

    _POLL_S = 0.5

    def __init__(
        self, db: Database, on_release: Callable[[], None], *, channel: str = CHANNEL
    ) -> None:
        self._db = db
        self._on_release = on_release
        self._channel = channel
        self._stopped = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{channel}-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening and wait for the thread (a poll interval or so)."""
        self._stopped.set()
        self._thread.join(self._POLL_S * 8)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._listen()
            except Exception as exc:  # a dropped connection: listen again
                log.warning("%s listener: %s; listening again", self._channel, exc)
                self._stopped.wait(self._POLL_S)

    def _listen(self) -> None:
        raw = self._db.engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # this connection is the listener's, never the pool's again
        try:
            conn.rollback()
            conn.autocommit = True
            from psycopg import sql  # here only: PostgreSQL's driver, present with it

            listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))  # quoted identifier
            conn.execute(listen)
            self.ready.set()
            while not self._stopped.is_set():
                for _notice in conn.notifies(timeout=self._POLL_S):
                    self._on_release()
        finally:
            with contextlib.suppress(Exception):
                raw.close()
