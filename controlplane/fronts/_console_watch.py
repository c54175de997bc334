"""`ChangeFeed`: one watcher of the store per console process, however many pages are open.

A thread reads the store's change marker (`persistence.ChangeMarker`: one tiny read) every
`TICK_S`; when it moved, every open page's stream is woken and reads its own view once. So
an idle console costs the store a few marker reads a second whatever the number of pages,
and a change made by any runtime reaches every page within a tick plus one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from controlplane.contract import SubagentControlError

if TYPE_CHECKING:
    from persistence import ChangeMarker

__all__ = ["TICK_S", "ChangeFeed"]

log = logging.getLogger(__name__)

TICK_S: Final = 0.2
"""How often the store's change marker is read."""


class ChangeFeed:
    """Wakes the streams of the pages when the store changed.

    Args:
        marker: The store's change marker (the feed closes it when it stops).
        tick_s: How often to read it.
    """

    def __init__(self, marker: ChangeMarker, *, tick_s: float = TICK_S) -> None:
        self._marker = marker
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiters: dict[asyncio.Event, asyncio.AbstractEventLoop] = {}
        self._hooks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._watch, name="console-feed", daemon=True)
        self.reads = 0
        """How many times the marker was read (the console's idle load on the store)."""
        self.changes = 0
        """How many times the streams were woken (a change seen, or a poke)."""
        self.view_reads = 0
        """How many times a page's view was read from the store (once per change and kind
        of page, however many pages show it)."""

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching, wake every stream (so it ends), and close the marker."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.poke()
        self._marker.close()

    @property
    def stopped(self) -> bool:
        """Whether `stop` was called: streams end."""
        return self._stop.is_set()

    def subscribe(self) -> asyncio.Event:
        """An event set (on the caller's loop) each time the store changes."""
        event = asyncio.Event()
        with self._lock:
            self._waiters[event] = asyncio.get_running_loop()
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        """Stop waking ``event``."""
        with self._lock:
            self._waiters.pop(event, None)

    def on_change(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` (on the watcher's thread, or the poker's) before streams wake."""
        with self._lock:
            self._hooks.append(hook)

    def poke(self) -> None:
        """Wake every stream now (after the console's own change, or at the end)."""
        with self._lock:
            waiters = list(self._waiters.items())
            hooks = list(self._hooks)
            self.changes += 1
        for hook in hooks:
            hook()
        for event, loop in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(event.set)

    def _watch(self) -> None:
        last: object = None
        while not self._stop.wait(self._tick_s):
            try:
                now = self._marker.read()
            except SubagentControlError as exc:
                log.warning("console: cannot read the store's change marker: %s", exc)
                continue
            self.reads += 1
            if now != last:
                last = now
                self.poke()
