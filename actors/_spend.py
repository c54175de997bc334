"""One activation's spend as its transcript writes it, for its budgets.

The transcript writer hands every event of its own turn here: before the write, a model
call's usage is priced (its cost computed once and stored with it, so a later price change
never rewrites it); after the write, it counts in the turn's running total, which the
Task's snapshot and the tree dump read (`total`), and a model call's tokens go to the
token usage metric (`ActivationTrace.model_call`). Only what was written counts: a held
event dropped with an unpublished turn never does.

This rides every model call's append, so it works on the stored dict's ints directly: no
`Usage` is validated or built per call (that cost more than a SQLite append's half),
only when someone reads the total.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from controlplane.contract import (
    NO_TRACE,
    USAGE,
    USAGE_REPORTED,
    ActivationTrace,
    NewEvent,
    Price,
    SessionEvent,
    Usage,
    UsageCounts,
    usage_counts,
)

__all__ = ["TurnSpend"]

_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "model_calls",
    "tool_calls",
)
_PRICED: Final = frozenset(("input_tokens", "output_tokens", "cached_input_tokens", "model_calls"))
_TOKENS: Final = frozenset(
    ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
)
_Sums = UsageCounts
_NOTHING: Final[_Sums] = (0, 0, 0, 0, 0, 0, None)


class TurnSpend:
    """Prices one turn's model calls and counts what the turn wrote.

    Args:
        turn: The activation's turn: events of other turns (a fork's seed, copied from
            its parent) are neither priced nor counted.
        price: The child's model's price; None leaves costs unknown.
        trace: The activation's trace, whose token usage metric counts each model call.
    """

    __slots__ = ("_parsed", "_price", "_read", "_sums", "_trace", "_turn")

    def __init__(
        self, turn: int, *, price: Price | None = None, trace: ActivationTrace = NO_TRACE
    ) -> None:
        self._turn = turn
        self._price = price
        self._trace = trace
        self._sums: _Sums = _NOTHING  # swapped whole: read from any thread
        self._read: tuple[_Sums, Usage] = (_NOTHING, Usage.zero())
        # The usage entries `priced` read, by identity, until `written` counts them: a
        # model call's usage is parsed once on its way to the store.
        self._parsed: dict[int, tuple[dict[str, Any], UsageCounts]] = {}

    @property
    def total(self) -> Usage:
        """What the turn has written so far (any thread)."""
        sums, (read, usage) = self._sums, self._read
        if sums is read:
            return usage
        fields: dict[str, Any] = dict(zip((*_COUNTS, "cost"), sums, strict=True))
        usage = Usage.model_construct(**fields)
        self._read = (sums, usage)
        return usage

    def priced(self, data: Any) -> Any:
        """``data`` of an event about to be written, with its model call's cost: when it
        carries the usage of a call whose server reported tokens (not ``usage_reported:
        False``) and no cost of its own (a server's reported cost stays)."""
        if not isinstance(data, dict):
            return data
        entry = data.get(USAGE)
        counts = usage_counts(entry)
        if counts is None:
            return data
        assert isinstance(entry, dict)  # usage_counts reads dicts only
        price = self._price
        if (
            price is not None
            and "cost" not in entry
            and data.get(USAGE_REPORTED) is not False
            and not _PRICED.isdisjoint(entry)  # a tool call's count has no price
        ):
            inputs, outputs, cached = counts[0], counts[1], min(counts[2], counts[0])
            cost = price.cost_of(uncached=inputs - cached, cached=cached, output=outputs)
            entry = {**entry, "cost": cost}
            data = {**data, USAGE: entry}
            counts = (*counts[:6], cost)
        self._parsed[id(entry)] = (entry, counts)
        return data

    def written(self, events: Sequence[NewEvent]) -> None:
        """Count the usage of the turn's ``events``, just written (the writer's thread)."""
        self._count(events, traced=True)

    def earlier(self, events: Sequence[SessionEvent]) -> None:
        """Count the usage of the turn's ``events`` written by an earlier activation of the
        same Task (a turn continued after an approval, or recovered after its runtime
        ended): the Task's spend is its whole turn's, counted once. Already in
        the metrics, so not traced again."""
        self._count(events, traced=False)

    def _count(self, events: Sequence[NewEvent] | Sequence[SessionEvent], *, traced: bool) -> None:
        for event in events:
            data = event.data
            if event.turn != self._turn or not isinstance(data, dict):
                continue
            entry = data.get(USAGE)
            if not isinstance(entry, dict):
                continue
            parsed = self._parsed.pop(id(entry), None)
            counts = parsed[1] if parsed is not None and parsed[0] is entry else usage_counts(entry)
            if counts is None:
                continue
            sums = self._sums
            cost = counts[6] if sums[6] is None else sums[6] + (counts[6] or 0.0)
            self._sums = (
                sums[0] + counts[0], sums[1] + counts[1], sums[2] + counts[2],
                sums[3] + counts[3], sums[4] + counts[4], sums[5] + counts[5], cost,
            )  # fmt: skip
            if traced and data.get(USAGE_REPORTED) is not False and not _TOKENS.isdisjoint(entry):
                self._trace.model_call(counts[0], counts[1])
