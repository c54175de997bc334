"""Wake-ups for work that a runtime with a child's provider can take: a turn handed over on
close, a Task that waits where its provider is.

Two moments leave a running Task that no live runtime runs: a runtime without the child's
provider left it ``queued`` for one that has it (`persistence._claims.Claims.await_provider`),
and a runtime closed with turns it handed over (its row closed, its Tasks still running).
Every runtime finds both at its sweep (a third of its lease); a wake-up lets one with the
provider take them at once instead:

- PostgreSQL: the runtime that left such a Task announces it (`Takeable.announce`): a
  ``pg_notify`` on `TAKEABLE_CHANNEL`, sent after its write committed, as a statement of
  its own that writes nothing (as the inbox and the admission queue do: a notify inside a
  write would serialize every notifying commit of the cluster behind one lock held through
  each one's WAL flush). Every runtime that watches listens on that channel, on a
  connection of its own.
- SQLite (one host): no notifications; each watching runtime polls the running Tasks'
  partial index every `POLL_S` for takeable Tasks (one short read: the running Tasks, not
  the settled ones), and wakes when one appears that it had not seen.

Best effort either way: a wake-up lost (a listener reconnecting, a poll that failed) costs
the wait for the next sweep, never a Task.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from persistence._runtime_sql import TAKEABLE_CHANNEL

if TYPE_CHECKING:
    from persistence._port import StorePort

__all__ = ["POLL_S", "Takeable", "Watch"]

log = logging.getLogger(__name__)

POLL_S: Final = 0.1
"""How often a watching runtime reads the takeable Tasks on SQLite."""


class Watch(Protocol):
    """A running watch for takeable Tasks."""

    def close(self) -> None:
        """Stop watching (returns within a poll or so)."""


class Takeable:
    """The store's side of the wake-ups (see the module docstring)."""

    def __init__(self, port: StorePort) -> None:
        self._s = port
        self._notifies = port.dialect.notifies

    def announce(self) -> None:
        """Tell every watching runtime that a Task can be taken, once the write that left
        it has committed (PostgreSQL; SQLite's watchers poll). Never raises: a wake-up
        that could not be sent costs the next sweep."""
        wake = self._s.sql.runtimes.wake
        if wake is None:
            return
        try:
            with self._s.db.cursor(write=False) as cursor:
                cursor.execute(wake, (TAKEABLE_CHANNEL,))
        except self._s.db.errors as exc:
            log.info("could not announce a takeable task: %s", exc)

    def watch(self, on_takeable: Callable[[], None]) -> Watch:
        """Call ``on_takeable()`` (it must not block) whenever a Task may have become
        takeable: on each announcement (PostgreSQL), or when a poll finds a takeable Task
        it had not seen (SQLite)."""
        if self._notifies:
            from persistence._queue_listener import AdmissionListener

            return AdmissionListener(self._s.db, on_takeable, channel=TAKEABLE_CHANNEL)
        if self._s.db.backend.single_connection:
            return _Idle()  # an in-memory store: no other runtime shares it
        return _Poller(self._read, on_takeable)

    def _read(self) -> frozenset[str]:
        """The ids of the running Tasks that no live runtime runs."""
        with self._s.db.cursor(write=False) as cursor:
            cursor.execute(self._s.sql.runtimes.takeable)
            return frozenset(str(row[0]) for row in cursor.fetchall())


class _Idle:
    """A watch with nothing to watch."""

    def close(self) -> None:
        return None


class _Poller:
    """One daemon thread reading the takeable Tasks every `POLL_S`."""

    def __init__(self, read: Callable[[], frozenset[str]], on_takeable: Callable[[], None]
                 ) -> None:  # fmt: skip
        self._read = read
        self._on_takeable = on_takeable
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="takeable-poller", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(POLL_S * 20)

    def _run(self) -> None:
        seen: frozenset[str] = frozenset()
        first = True
        while not self._stopped.wait(0.0 if first else POLL_S):
            try:
                found = self._read()
            except Exception as exc:  # the store is busy or away: the sweep still runs
                log.debug("takeable poll failed: %s", exc)
                continue
            if found - seen and not first:
                with contextlib.suppress(Exception):
                    self._on_takeable()
            seen, first = found, False
