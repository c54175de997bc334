"""Sealed turns: a finished turn's open rows packed into segment rows, and read back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import orjson

from controlplane.contract import SessionEvent
from persistence._codec import EXACT_MARK, decode_events
from persistence._schema import sqlite_time

__all__ = [
    "SEGMENT_CHARS",
    "SEGMENT_EVENTS",
    "Segment",
    "batch_range",
    "decode_segment",
    "seal",
]


class Segment(NamedTuple):
    """Sealed events as one row of the segments table."""

    first_seq: int
    last_seq: int
    events: str
    batches: str


SEGMENT_EVENTS: Final = 512
SEGMENT_CHARS: Final = 1 << 20
"""A segment ends at this many events or characters of event text, whichever comes
first: a long turn becomes several rows, none too large to read or rewrite at once."""


def seal(rows: Sequence[Sequence[Any]]) -> list[Segment]:
    """Open rows of ``seq, turn, kind, data, source, created_at, batch_id`` (in ``seq``
    order) packed into segments, from the stored texts as they are: no event is decoded
    or re-encoded, so a sealed event reads back exactly as its open row did.

    Data written on the exact path (`to_json`'s leading-space marker) marks its whole
    segment the same way, so that segment is decoded exactly too.
    """
    segments: list[Segment] = []
    parts: list[str] = []
    batches: list[list[Any]] = []
    size = 0
    exact_path = False

    def close() -> None:
        nonlocal parts, batches, size, exact_path
        first, last = batches[0][1], batches[-1][2]
        text = ("[" if not exact_path else EXACT_MARK + "[") + ",".join(parts) + "]"
        segments.append(Segment(first, last, text, orjson.dumps(batches).decode()))
        parts, batches, size, exact_path = [], [], 0, False

    for seq, turn, kind, data, source, stamp, batch in rows:
        if parts and (len(parts) >= SEGMENT_EVENTS or size + len(data) > SEGMENT_CHARS):
            close()
        stamp_text = stamp if isinstance(stamp, str) else sqlite_time(stamp)
        source_text = "null" if source is None else orjson.dumps(source).decode()
        parts.append(
            f'[{seq},{turn},{orjson.dumps(kind).decode()},{data},{source_text},"{stamp_text}"]'
        )
        size += len(data)
        exact_path = exact_path or data[:1] == EXACT_MARK
        if batches and batches[-1][0] == batch and batches[-1][2] == seq - 1:
            batches[-1][2] = seq
        else:
            batches.append([batch, seq, seq])
    if parts:
        close()
    return segments


def decode_segment(events: str) -> list[SessionEvent]:
    """The events of one segment's ``events`` text."""
    return decode_events(_OneRow((0, None, None, events, None, None)))


class _OneRow:
    """A cursor over one row, for `decode_events`."""

    def __init__(self, row: tuple[Any, ...]) -> None:
        self._rows = [row]

    def fetchmany(self, size: int = 1, /) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows


def batch_range(batches: str, batch: str) -> tuple[int, int] | None:
    """The ``seq`` range a segment's ``batches`` give for ``batch``, or None."""
    for batch_id, first, last in orjson.loads(batches):
        if batch_id == batch:
            return first, last
    return None
