"""A thread listening on a PostgreSQL channel with a connection of its own, which it drops
and opens again when told the network was out (`Listening.refresh`).

A connection that lived through an outage can hold its notifications back for seconds
after the network is back. The server keeps sending notifications while none of them is
acknowledged (the network dropped the packets, or only the acknowledgements), its TCP backs
off (retransmissions 0.2, 0.4, 0.8, 1.6 s … apart) and sends nothing new until one of them
is acknowledged: after a 2 s outage, up to 1.6 s more; after 6 s, over 3 s. A fresh
connection has no such past. Notifications sent while the listener is between connections
are lost; every user here is built for that (a forwarded message is notified again every
half second until taken, an answer and an admission slot are also polled).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from persistence._database import Database

__all__ = ["Listening", "refresh_listeners"]

log = logging.getLogger(__name__)

POLL_S = 0.25
"""How often the listening thread looks up from its connection (to stop, or to reconnect)."""
RECONNECT_S = 0.5
"""The pause before listening again after the connection failed."""

_live: weakref.WeakSet[Listening] = weakref.WeakSet()
_live_lock = threading.Lock()


def refresh_listeners(db: Database) -> int:
    """Tell every listener on ``db`` to listen again on a new connection; how many."""
    with _live_lock:
        listening = [one for one in _live if one.db is db]
    for one in listening:
        one.refresh()
    return len(listening)


class Listening:
    """One thread with its own connection, calling ``on_notice(payload)`` for each
    notification on ``channel`` (reconnecting if the connection drops, or when told to).

    Args:
        db: The store's database (PostgreSQL).
        channel: The channel (quoted as an identifier).
        on_notice: Called on the listening thread with each notification's payload; an
            exception from it is logged and the listening goes on.
        name: The thread's name.
    """

    def __init__(
        self, db: Database, channel: str, on_notice: Callable[[str], None], *, name: str
    ) -> None:
        self.db = db
        self._channel = channel
        self._on_notice = on_notice
        self._stopped = threading.Event()
        self._refresh = threading.Event()
        self.ready = threading.Event()
        """Set once it listens (a notification sent before that goes unheard)."""
        self.connections = 0
        """How many connections it has listened on (for tests)."""
        with _live_lock:
            _live.add(self)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        """Listen again on a new connection, within `POLL_S` (the network was out)."""
        self._refresh.set()

    def close(self) -> None:
        """Stop listening and wait for the thread (a poll interval or so)."""
        self._stopped.set()
        self._thread.join(POLL_S * 8)
        with _live_lock:
            _live.discard(self)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._listen()
            except Exception as exc:  # a dropped connection: listen again
                if self._refresh.is_set():  # told to, and its wait was cut: no pause
                    continue
                log.warning("listener %s: %s; listening again", self._channel, exc)
                self._stopped.wait(RECONNECT_S)

    def _listen(self) -> None:
        self._refresh.clear()  # what follows is the new connection
        raw = self.db.engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # this connection is the listener's, never the pool's again
        try:
            conn.rollback()
            conn.autocommit = True
            from psycopg import sql  # here only: PostgreSQL's driver, present with it

            listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))  # quoted
            conn.execute(listen)
            self.connections += 1
            self.ready.set()
            while not self._stopped.is_set() and not self._refresh.is_set():
                for notice in conn.notifies(timeout=POLL_S):
                    try:
                        self._on_notice(str(notice.payload))
                    except Exception:  # a bug in a callback must not end the listening
                        log.exception("listener %s: handling %s failed", self._channel, notice)
        finally:
            with contextlib.suppress(Exception):
                raw.close()
