"""What a child spent: `Usage`, and how it is read back from a transcript.

Usage is recorded in the transcript itself, in the ``data`` of the event it belongs to
(``data["usage"]``): a model call's with the ``assistant/message`` it wrote, a tool call's
with its ``tool/result``. So it is durable in the same write as the message (never a
second record that a crash could separate from it), and any spend (a turn, a child, later a
tree) is a sum over events, which `usage_of` computes. A model call whose server did not
report its tokens says so (``data["usage_reported"] = False``) and counts its call only:
zeros are never written as if reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, model_validator

from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._json import count_problem

if TYPE_CHECKING:
    from controlplane.contract._session import SessionEvent

__all__ = [
    "USAGE",
    "USAGE_REPORTED",
    "Usage",
    "UsageCounts",
    "read_usage",
    "usage_counts",
    "usage_data",
    "usage_of",
]

USAGE: Final = "usage"
"""Event ``data`` key: what the event's model or tool call spent (a `Usage` as a dict,
zero fields left out)."""
USAGE_REPORTED: Final = "usage_reported"
"""Event ``data`` key, False when the model call ran but its server (or agent) reported no
token counts: its ``usage`` then counts the call, not tokens."""

_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "model_calls",
    "tool_calls",
)
_FIELDS = (*_COUNTS, "cost")


class Usage(BaseModel):
    """What a model call, a turn or a child spent. Immutable; add with ``+``.

    Attributes:
        input_tokens: Prompt tokens, cached ones included.
        output_tokens: Completion tokens, reasoning ones included.
        cached_input_tokens: The part of ``input_tokens`` the server read from its cache.
        reasoning_tokens: The part of ``output_tokens`` spent on reasoning.
        model_calls: Model calls made.
        tool_calls: Tool calls that returned a result.
        cost: What it cost, when a price was known; None otherwise (not zero: unknown).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a count that is not a whole number
            >= 0, a cost that is not a finite number >= 0, or an unknown field.
    """

    # `model_calls` is a public name; pydantic before 2.10 reserves the prefix ``model_`` and
    # warns at import (on stderr, in every CLI run) unless the namespace is opened.
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    cost: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, value: Any) -> Any:
        # A coded error, not a pydantic ValidationError: a bad count is the caller's input
        # (a scripted reply, a server's report), refused at the call like any other.
        if not isinstance(value, Mapping):
            return value
        unknown = sorted(str(key) for key in value if key not in _FIELDS)
        if unknown:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"usage has no field {unknown[0]!r}; its fields: {_FIELDS}"
            )
        for name in _COUNTS:
            if name in value:
                problem = count_problem(value[name], at_least=0)
                if problem is not None:
                    raise SubagentControlError(ErrorCode.INVALID_INPUT, f"usage {name} {problem}")
        cost = value.get("cost")
        if cost is not None and (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"usage cost must be a finite number >= 0 or None, not {cost!r}",
            )
        return value

    @classmethod
    def zero(cls) -> Usage:
        """Nothing spent: the start of a sum."""
        return _ZERO

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens (what a token budget counts)."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: object) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        # An unknown cost does not hide a known one: None + x is x.
        if self.cost is None or other.cost is None:
            cost = other.cost if self.cost is None else self.cost
        else:
            cost = self.cost + other.cost
        return Usage.model_construct(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            model_calls=self.model_calls + other.model_calls,
            tool_calls=self.tool_calls + other.tool_calls,
            cost=cost,
        )

    def stored(self) -> dict[str, Any]:
        """The ``data["usage"]`` form: only the fields that are not zero (or None)."""
        # By hand, not `model_dump`: it runs on every model call's append (a third of the
        # cost of recording usage went to pydantic's serializer).
        stored: dict[str, Any] = {name: n for name in _COUNTS if (n := getattr(self, name))}
        if self.cost is not None:
            stored["cost"] = self.cost
        return stored


_ZERO: Final = Usage()


def usage_data(reported: Usage | None, *, counted: Usage = _ZERO) -> dict[str, Any]:
    """The ``data`` keys that record one call's spend in the event it wrote.

    Args:
        reported: What the server (or agent) reported; None when it reported nothing,
            recorded as ``usage_reported: False`` (never as zeros).
        counted: What the writer saw for itself (one model call, one tool call); its
            non-zero fields stand over the reported ones.
    """
    if reported is None:
        seen = counted.stored()
        return {USAGE: seen, USAGE_REPORTED: False} if seen else {USAGE_REPORTED: False}
    if counted is _ZERO:
        return {USAGE: reported.stored()}
    return {USAGE: {**reported.stored(), **counted.stored()}}


UsageCounts = tuple[int, int, int, int, int, int, float | None]
"""A stored usage's fields in `Usage`'s order: its six counts, then its cost (None:
unknown)."""

_FIELD_SET: Final = frozenset(_FIELDS)


def usage_counts(entry: object) -> UsageCounts | None:
    """The one reader of a stored usage (an event's ``data["usage"]``, a Task row's spend).

    Returns its fields, or None for an entry that is not a usage this code writes: not a
    dict, a key `Usage` does not have, a count that is not a whole number >= 0, a cost that
    is not a finite number >= 0 or None. Such an entry (written under the key by something
    else) counts nothing, in whole, wherever it is read: never guessed at, never half
    counted. The rule is `Usage`'s own validation, unrolled (it rides every model call's
    append: pricing, counting and the store's spend read it).
    """
    if not isinstance(entry, dict) or not _FIELD_SET.issuperset(entry):
        return None
    get = entry.get
    a, b, c = get("input_tokens", 0), get("output_tokens", 0), get("cached_input_tokens", 0)
    d, e, f = get("reasoning_tokens", 0), get("model_calls", 0), get("tool_calls", 0)
    if not (type(a) is type(b) is type(c) is type(d) is type(e) is type(f) is int):
        return None
    if a < 0 or b < 0 or c < 0 or d < 0 or e < 0 or f < 0:
        return None
    cost = get("cost")
    if cost is not None and (
        (cost.__class__ is not float and cost.__class__ is not int)
        or not math.isfinite(cost)
        or cost < 0
    ):
        return None
    return a, b, c, d, e, f, cost


def read_usage(entry: object) -> Usage | None:
    """A stored usage as a `Usage` (see `usage_counts` for what is not one: None)."""
    counts = usage_counts(entry)
    if counts is None:
        return None
    a, b, c, d, e, f, cost = counts
    return Usage.model_construct(
        input_tokens=a,
        output_tokens=b,
        cached_input_tokens=c,
        reasoning_tokens=d,
        model_calls=e,
        tool_calls=f,
        cost=None if cost is None else float(cost),
    )


def usage_of(events: Iterable[SessionEvent]) -> Usage:
    """The sum of the usage recorded in ``events`` (their ``data["usage"]``).

    Pass a child's own events (`LoadedSession.own_events`): a fork's seed is its parent's
    history, and its spend the parent's. An entry that is not a valid usage (written by
    something else under the key) is skipped, not guessed at (`usage_counts`).
    """
    total = _ZERO
    for event in events:
        data = event.data
        if not isinstance(data, dict):
            continue
        usage = read_usage(data.get(USAGE))
        if usage is not None:
            total = total + usage
    return total
