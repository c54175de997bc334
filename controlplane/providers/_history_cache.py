"""The rebuilt conversations of recently resumed children, so a resume rebuilds only what
was written since the last one.

Rebuilding a child's conversation from its whole transcript at every resume makes a turn's
CPU grow with the child's history. A child's events never change once written and each new
one has a higher ``seq``, so the conversation of a transcript's first ``n`` events is the
same every time: the cache keeps, per child, the rebuild that stood after them and goes on
from a copy of it with the events after them.

Nothing here decides what the events are: every resume passes the events the store has
just read (another runtime may have written to the child since). An entry is used only
when that read still holds the events it was built from at the same places (its first and
its last, compared by value: a ``seq`` is never reused within a child, and an event at a
place proves the ones before it), and when the next event ends the turn the entry stood in
(the entry's rebuild has ended that turn); otherwise the whole transcript is rebuilt and
replaces the entry. The entries are bounded in number, in messages held and in their
weight (the messages' text plus a fixed allowance per message: a few long tool outputs
weigh what thousands of short messages do).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.contract import SessionEvent
from controlplane.providers._chat_history import Rebuild, UnansweredCall
from controlplane.providers._model import ChatMessage

__all__ = ["HistoryCache"]


@dataclass(frozen=True, slots=True)
class _Entry:
    count: int  # the events it was built from: the transcript's first ``count``
    first: SessionEvent
    last: SessionEvent
    rebuild: Rebuild  # after those events, its turn ended; never fed again (copied first)
    weight: int  # `_weigh` of its messages


MAX_BYTES = 16 * 1024 * 1024
"""What the kept conversations of one provider weigh together at most, by default."""

MESSAGE_BYTES = 400
"""The allowance per kept message for the objects around its text (the model, its lists)."""


def _weigh(messages: Sequence[ChatMessage]) -> int:
    return sum(len(message.text) for message in messages) + MESSAGE_BYTES * len(messages)


class HistoryCache:
    """Per child, the conversation rebuilt from its events at its last resume.

    Args:
        max_children: How many children's conversations are kept (least recently used
            go first).
        max_messages: How many messages all kept conversations hold together at most.
        max_bytes: How much all kept conversations weigh together at most (their text
            plus `MESSAGE_BYTES` per message); ``None``: `MAX_BYTES`.
    """

    def __init__(
        self, *, max_children: int = 64, max_messages: int = 20_000, max_bytes: int | None = None
    ) -> None:
        self._max_children = max_children
        self._max_messages = max_messages
        self._max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._messages = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def rebuild(
        self, child_id: str, events: Sequence[SessionEvent]
    ) -> tuple[list[ChatMessage], list[UnansweredCall]]:
        """`chat_history_with_unanswered` of ``events`` (child ``child_id``'s, oldest first),
        going on from the child's kept rebuild when ``events`` continue it."""
        with self._lock:
            entry = self._entries.get(child_id)
        start = kept = replaced = 0
        if entry is not None and _continues(entry, events):
            rebuild, start = entry.rebuild.copy(), entry.count
            kept, replaced = len(rebuild.messages), rebuild.replaced
        else:
            rebuild = Rebuild()
        rebuild.feed(events[start:] if start else events)
        rebuild.end_turn()
        messages, unanswered = list(rebuild.messages), rebuild.unanswered()
        if events:
            if entry is not None and start and rebuild.replaced == replaced:
                # The kept messages stand as they were (a reply that gained its calls keeps
                # its text): weigh only the new ones, not the whole conversation each turn.
                weight = entry.weight + _weigh(messages[kept:])
            else:
                weight = _weigh(messages)
            self._keep(child_id, _Entry(len(events), events[0], events[-1], rebuild, weight))
        return messages, unanswered

    def forget(self, child_id: str) -> None:
        """Drop the child's kept conversation, if any."""
        with self._lock:
            self._drop(self._entries.pop(child_id, None))

    def __len__(self) -> int:
        return len(self._entries)

    def _keep(self, child_id: str, entry: _Entry) -> None:
        size = len(entry.rebuild.messages)
        with self._lock:
            self._drop(self._entries.pop(child_id, None))
            if size > self._max_messages or entry.weight > self._max_bytes:
                return
            self._entries[child_id] = entry
            self._messages += size
            self._bytes += entry.weight
            while (
                len(self._entries) > self._max_children
                or self._messages > self._max_messages
                or self._bytes > self._max_bytes
            ):
                self._drop(self._entries.popitem(last=False)[1])

    def _drop(self, entry: _Entry | None) -> None:
        if entry is not None:
            self._messages -= len(entry.rebuild.messages)
            self._bytes -= entry.weight


def _continues(entry: _Entry, events: Sequence[SessionEvent]) -> bool:
    """Whether ``events`` hold the entry's events at the same places, and whether the event
    after them (if any) ends the turn the entry's rebuild ended."""
    count = len(events)
    if count < entry.count:
        return False
    if not _same(events[entry.count - 1], entry.last) or not _same(events[0], entry.first):
        return False
    return count == entry.count or entry.rebuild.ends_turn_at(events[entry.count])


def _same(event: SessionEvent, kept: SessionEvent) -> bool:
    return event is kept or event == kept
