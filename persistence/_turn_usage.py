"""A Task's spend as its Task row keeps it: the sum of its turn's recorded usage.

A Task's usage is written with its settlement (the ``usage`` column, JSON text), by the
transaction that settles it: the append of its ``turn/end``, or the settlement that closes
its open turn when no ``turn/end`` carried it (a sweep of a dead runtime's Tasks, a
takeover, a settlement written late). Either way it is summed here from the turn's open
rows, which that transaction reads under the child's lock anyway (to seal them), so the
row always agrees with the transcript, whichever runtime settled it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import orjson

from controlplane.contract import USAGE, EventKind, Usage, read_usage
from persistence._codec import from_json

__all__ = ["open_turn_usage", "stored_usage", "turn_usage", "usage_column"]

_MARK: Final = f'"{USAGE}"'


def turn_usage(rows: Iterable[Sequence[Any]], turn: int) -> Usage:
    """The usage recorded in open rows (``seq, turn, kind, data, …``) of ``turn``. Only
    rows whose text names a usage are decoded: a turn's end costs a substring search per
    event, not a parse."""
    total = Usage.zero()
    for row in rows:
        data = row[3]
        if row[1] != turn or not isinstance(data, str) or _MARK not in data:
            continue
        decoded = from_json(data)
        usage = read_usage(decoded.get(USAGE)) if isinstance(decoded, dict) else None
        if usage is not None:  # None: written under the key by something else
            total = total + usage
    return total


def open_turn_usage(rows: Sequence[Sequence[Any]], task_id: str) -> Usage:
    """What ``task_id``'s open turn has written so far, from the child's open rows; zero
    when the open tail is not that Task's turn (it has not begun, or has ended)."""
    for _seq, turn, kind, data, *_rest in reversed(rows):
        if kind == EventKind.TURN_END:
            return Usage.zero()
        if kind == EventKind.TURN_START:
            opened = from_json(data) if isinstance(data, str) and data else None
            if isinstance(opened, dict) and opened.get("task_id") == task_id:
                return turn_usage(rows, int(turn))
            return Usage.zero()
    return Usage.zero()


def usage_column(usage: Usage) -> str | None:
    """The ``usage`` column's text for a Task's spend (None for nothing spent)."""
    stored = usage.stored()
    return orjson.dumps(stored).decode() if stored else None


def stored_usage(text: object) -> Usage:
    """A Task row's ``usage`` column as a `Usage` (zero for NULL, or a text not ours)."""
    if not isinstance(text, str | bytes) or not text:
        return Usage.zero()
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return Usage.zero()
    return read_usage(value) or Usage.zero()
