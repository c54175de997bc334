"""One activation's spend as its transcript writes it (SPEC §11).

The transcript writer hands every event of its own turn here: before the write, a model
call's usage is priced (`controlplane.contract.priced`: cost computed once, stored with
the usage, so a later price change never rewrites it); after the write, the usage counts
in the Task's running snapshot (`TaskService.spent`) and a model call's tokens in the
token usage metric (`ActivationTrace.model_call`). Only what was written counts: a held
event dropped with an unpublished turn never does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from controlplane.contract import (
    NO_TRACE,
    USAGE,
    USAGE_REPORTED,
    ActivationTrace,
    NewEvent,
    Price,
    SubagentControlError,
    Usage,
    priced,
)

__all__ = ["TurnSpend"]

_TOKENS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


class TurnSpend:
    """Prices one turn's model calls and counts what the turn wrote.

    Args:
        turn: The activation's turn: events of other turns (a fork's seed, copied from
            its parent) are neither priced nor counted.
        price: The child's model's price; None leaves costs unknown.
        spent: Called with each written call's usage (the Task's running snapshot).
        trace: The activation's trace, whose token usage metric counts each model call.
    """

    __slots__ = ("_price", "_spent", "_trace", "_turn", "total")

    def __init__(
        self,
        turn: int,
        *,
        price: Price | None = None,
        spent: Callable[[Usage], object] | None = None,
        trace: ActivationTrace = NO_TRACE,
    ) -> None:
        self._turn = turn
        self._price = price
        self._spent = spent
        self._trace = trace
        self.total = Usage.zero()
        """What the turn has written so far (swapped whole: read from any thread)."""

    def priced(self, data: Any) -> Any:
        """``data`` of an event about to be written, its model call's cost filled in."""
        if self._price is None or not isinstance(data, dict) or USAGE not in data:
            return data
        return priced(data, self._price)

    def written(self, events: Sequence[NewEvent]) -> None:
        """Count the usage of the turn's ``events``, just written."""
        for event in events:
            data = event.data
            if event.turn != self._turn or not isinstance(data, dict):
                continue
            entry = data.get(USAGE)
            if not isinstance(entry, dict):
                continue
            try:
                usage = Usage.model_validate(entry)
            except (SubagentControlError, ValueError):
                continue  # not a usage of ours: not counted (as `usage_of` skips it)
            self.total = self.total + usage
            if self._spent is not None:
                self._spent(usage)
            if data.get(USAGE_REPORTED) is not False and any(name in entry for name in _TOKENS):
                self._trace.model_call(usage)
