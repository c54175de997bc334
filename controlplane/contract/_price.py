"""What tokens cost: `Price` per model, the `Prices` a control plane was opened with, and
the cost of one call's usage.

Cost is computed once, when a call's usage is written (`actors._spend.TurnSpend`), and
stored with it: a later change of prices never rewrites what a turn cost. A usage whose server
reported a cost keeps it; one with no known price keeps ``cost`` None (unknown, never 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, model_validator

from controlplane.contract._descriptor import Descriptor
from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._usage import Usage

__all__ = ["Price", "Prices"]

_FIELDS: Final = ("input", "output", "cached_input")
_PER_TOKEN: Final = 1e-6  # prices are per million tokens


class Price(BaseModel):
    """What one model's tokens cost, in USD per million tokens.

    Example:
        >>> Price(input=3.0, output=15.0, cached_input=0.3)  # doctest: +SKIP

    Attributes:
        input: An uncached input token's price.
        output: An output token's price (reasoning tokens included).
        cached_input: A cached input token's price; ``input``'s when not given.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a price that is not a finite number
            >= 0, a missing ``input`` or ``output``, or an unknown field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float
    output: float
    cached_input: float

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, value: Any) -> Any:
        # A coded error at the call (`open(prices=...)`), not pydantic's ValidationError.
        if not isinstance(value, Mapping):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a price must be a Price or a mapping of {_FIELDS}, not {type(value).__name__}",
            )
        unknown = sorted(str(key) for key in value if key not in _FIELDS)
        if unknown:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a price has no field {unknown[0]!r}; its fields: {_FIELDS}",
            )
        for name in ("input", "output"):
            if name not in value:
                raise SubagentControlError(
                    ErrorCode.INVALID_INPUT, f"a price needs {name!r} (USD per million tokens)"
                )
        for name in _FIELDS:
            if name in value and not _is_price(value[name]):
                raise SubagentControlError(
                    ErrorCode.INVALID_INPUT,
                    f"price {name} must be a finite number >= 0 (USD per million tokens), "
                    f"not {value[name]!r}",
                )
        checked = {name: float(value[name]) for name in _FIELDS if name in value}
        checked.setdefault("cached_input", checked["input"])
        return checked

    def cost(self, usage: Usage) -> float:
        """What ``usage``'s tokens cost at this price (uncached input = input - cached)."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        return self.cost_of(
            uncached=usage.input_tokens - cached, cached=cached, output=usage.output_tokens
        )

    def cost_of(self, *, uncached: int, cached: int, output: int) -> float:
        """What these token counts cost at this price."""
        return (
            uncached * self.input + cached * self.cached_input + output * self.output
        ) * _PER_TOKEN


def _is_price(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


class Prices:
    """The prices a control plane was opened with (`SubagentControl.open(prices=...)`),
    keyed ``"provider:model"`` or ``"model"``. Immutable; checked whole when built.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a key that is not a non-empty string
            or a price that is not valid (`Price`); nothing is kept.
    """

    __slots__ = ("_by_key",)

    def __init__(self, prices: Mapping[str, Price | Mapping[str, Any]] | None = None) -> None:
        if prices is None:
            prices = {}
        if not isinstance(prices, Mapping):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                "prices must be a mapping of 'model' or 'provider:model' to a Price, "
                f"not {type(prices).__name__}",
            )
        by_key: dict[str, Price] = {}
        for key, price in prices.items():
            if not isinstance(key, str) or not key.strip():
                raise SubagentControlError(
                    ErrorCode.INVALID_INPUT,
                    f"a price's key must be a non-empty 'model' or 'provider:model', not {key!r}",
                )
            by_key[key] = price if isinstance(price, Price) else Price.model_validate(price)
        self._by_key: Mapping[str, Price] = by_key

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def for_descriptor(self, descriptor: Descriptor | None) -> Price | None:
        """The price of a child's model: ``"provider:model"`` first (the descriptor's
        provider, then its agent provider), then ``"model"``; None when none is known or
        the child names no model (``agent_model``)."""
        if descriptor is None or not self._by_key or not descriptor.agent_model:
            return None
        model = descriptor.agent_model
        keys = [f"{descriptor.provider}:{model}"]
        if descriptor.agent_provider:
            keys.append(f"{descriptor.agent_provider}:{model}")
        keys.append(model)
        for key in keys:
            price = self._by_key.get(key)
            if price is not None:
                return price
        return None

    def is_priced(self, descriptor: Descriptor | None) -> bool:
        """Whether a price is known for the child ``descriptor`` describes (a cost budget
        for an unpriced child could never be counted)."""
        return self.for_descriptor(descriptor) is not None
