"""The decoded transcripts of recently loaded children, so a load decodes only what was
written since the last one.

A resume loads the child's whole transcript, so a turn's load grows with the child's
history though almost all of it was decoded at the child's previous turn. A child's events
never change once committed (sealing moves a finished turn's rows into one segment row,
events unchanged), and each new one takes the next ``seq`` under the child's write lock,
so what a load finds is always a prefix of what a later load finds. A load of a kept child
therefore still reads the store, in one statement as a full load does (the header, then
only the segments and open rows after what it kept: another runtime may have written), and
joins what it read to what it kept.

Bounded in children, in events held and in their weight (the stored JSON they were
decoded from plus a fixed allowance per event for the objects around it: a few children
with long tool outputs weigh what thousands of short events do); each load hands its
caller a list of its own, and the events themselves are shared between loads (frozen
models; their ``data`` must not be changed in place, as no reader here does).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from persistence._codec import Transcript

__all__ = ["MAX_BYTES", "TranscriptCache", "weigh"]


class TranscriptCache:
    """Per child, its transcript as its last load decoded it.

    Args:
        max_children: How many children's transcripts are kept (least recently loaded go
            first).
        max_events: How many events all kept transcripts hold together at most.
        max_bytes: How much all kept transcripts weigh together at most (`weigh`);
            ``None``: `MAX_BYTES`.
    """

    def __init__(
        self, *, max_children: int = 64, max_events: int = 20_000, max_bytes: int | None = None
    ) -> None:
        self._max_children = max_children
        self._max_events = max_events
        self._max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._kept: OrderedDict[str, Transcript] = OrderedDict()
        self._events = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, child_id: str) -> Transcript | None:
        """The child's kept transcript (not to be changed), or None."""
        with self._lock:
            return self._kept.get(child_id)

    def keep(self, child_id: str, kept: Transcript | None, read: Transcript) -> Transcript:
        """Keep ``kept`` (what `get` returned, or None) joined with ``read`` (what the
        load read after it) as the child's transcript; the caller's copy of it."""
        whole = read if kept is None else kept.joined(read)
        size, weight = len(whole), weigh(whole)
        with self._lock:
            self._drop(self._kept.pop(child_id, None))
            if size > self._max_events or weight > self._max_bytes:
                return whole  # not kept: the caller's own
            self._kept[child_id] = whole
            self._events += size
            self._bytes += weight
            while (
                len(self._kept) > self._max_children
                or self._events > self._max_events
                or self._bytes > self._max_bytes
            ):
                self._drop(self._kept.popitem(last=False)[1])
        return whole.copy()

    @property
    def weight(self) -> int:
        """What the kept transcripts weigh together (`weigh`)."""
        with self._lock:
            return self._bytes

    def forget(self, child_id: str) -> None:
        """Drop the child's kept transcript, if any."""
        with self._lock:
            self._drop(self._kept.pop(child_id, None))

    def __len__(self) -> int:
        return len(self._kept)

    def _drop(self, transcript: Transcript | None) -> None:
        if transcript is not None:
            self._events -= len(transcript)
            self._bytes -= weigh(transcript)


MAX_BYTES = 16 * 1024 * 1024
"""What the kept transcripts of one store weigh together at most, by default (`weigh`)."""

EVENT_BYTES = 640
"""The allowance per kept event for the objects around its stored JSON (the event model,
its dicts, keys and timestamp): a load of 800 short events held 580 bytes per event beyond
their stored JSON (tracemalloc, CPython 3.11); long text costs about its stored length."""


def weigh(transcript: Transcript) -> int:
    """A transcript's weight in a cache: the stored JSON it was decoded from plus
    `EVENT_BYTES` per event."""
    return transcript.stored_bytes + EVENT_BYTES * len(transcript)
