"""The admission queue's listener: a runtime hears every release of a concurrency slot on
the store (PostgreSQL ``LISTEN``), so a Task waiting there tries at once, not at its next
poll. The same listener, on another channel, hears that a Task can be taken
(`persistence._takeable`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from persistence._listening import Listening
from persistence._queue_sql import CHANNEL

if TYPE_CHECKING:
    from persistence._database import Database

__all__ = ["AdmissionListener"]


class AdmissionListener:
    """One thread with its own connection listening on ``channel`` (PostgreSQL; `CHANNEL`
    by default), calling ``on_release()`` for each notification (`Listening`: a release
    missed while it reconnects only waits for the next poll)."""

    def __init__(
        self, db: Database, on_release: Callable[[], None], *, channel: str = CHANNEL
    ) -> None:
        self.listening = Listening(
            db, channel, lambda _payload: on_release(), name=f"{channel}-listener"
        )
        self.ready = self.listening.ready

    def close(self) -> None:
        """Stop listening and wait for the thread (a poll interval or so)."""
        self.listening.close()
