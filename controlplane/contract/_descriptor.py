"""The versioned, JSON-only record of how to re-create a child."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controlplane.contract._budget import Budget
from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._json import JsonValue, plain_json, storable_text
from controlplane.contract._session import EventKind, SessionEvent

__all__ = ["DESCRIPTOR_VERSION", "Descriptor", "fold_descriptor"]

DESCRIPTOR_VERSION: Literal[1] = 1


class Descriptor(BaseModel):
    """How to re-create a child: provider, model selectors, persona, tool filter, inputs.

    Unset fields are omitted from the stored event (`to_event_data`), never written as null.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = DESCRIPTOR_VERSION
    provider: str = Field(min_length=1)
    agent_provider: str | None = None
    agent_model: str | None = None
    persona: str | None = None
    tool_filter: dict[str, JsonValue] | None = None
    inputs: dict[str, JsonValue] | None = None
    budget: Budget | None = None
    """The child's budget at its start; `control.set_budget` replaces it in the
    store, where the spend is counted."""

    @classmethod
    def build(cls, **fields: Any) -> Descriptor:
        """Build a descriptor from plain values, detaching and checking every JSON field.

        Raises:
            SubagentControlError: ``INVALID_DESCRIPTOR`` for a value that is not plain JSON.
        """
        for name in ("provider", "agent_provider", "agent_model", "persona"):
            if fields.get(name) is not None:
                storable_text(
                    fields[name], code=ErrorCode.INVALID_DESCRIPTOR, what=f"descriptor {name}"
                )
        for name in ("tool_filter", "inputs"):
            if fields.get(name) is not None:
                fields[name] = plain_json(
                    fields[name], code=ErrorCode.INVALID_DESCRIPTOR, what=f"descriptor {name}"
                )
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise SubagentControlError(
                ErrorCode.INVALID_DESCRIPTOR, f"invalid descriptor: {_first_error(exc)}"
            ) from exc

    def to_event_data(self) -> dict[str, JsonValue]:
        """The JSON stored in the ``subagent/descriptor`` event."""
        return self.model_dump(mode="json", exclude_none=True)


def fold_descriptor(events: Sequence[SessionEvent]) -> Descriptor | None:
    """The newest supported descriptor among ``events``, or None when there is none."""
    # Newest first: the search ends at the first supported descriptor from the end. A
    # resume runs this over the child's whole transcript, so the kind is a local.
    descriptor_kind = EventKind.DESCRIPTOR
    for event in reversed(events):
        if event.kind != descriptor_kind or not isinstance(event.data, dict):
            continue
        if event.data.get("version") != DESCRIPTOR_VERSION:
            continue
        try:
            return Descriptor.model_validate(event.data)
        except (ValidationError, SubagentControlError):
            continue
    return None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "value"
    return f"{where}: {error['msg']}"
