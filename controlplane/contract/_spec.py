"""Inputs and results of the two entry points, `start_continuable` and `send_message`, and
the view of a parent's children (`children`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.contract._agents import AgentHandle
from controlplane.contract._content import TextBlock
from controlplane.contract._session import NewEvent
from controlplane.contract._usage import Usage

__all__ = ["ChildView", "ContinuableStart", "ContinuableStartSpec", "SendResult"]


class ContinuableStartSpec(BaseModel):
    """What to start: a provider, a label, a prompt and the parent that owns the child.

    ``prompt`` is a list of `TextBlock`, or a non-empty ``str`` (one text block).
    ``agent_provider``/``agent_model`` default to the parent's `ModelSelector`; a selector
    neither declares is omitted from the descriptor. ``seed_events`` (for the ``fork``
    provider) are copied into the child once, as its seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    provider: str
    label: str
    prompt: list[TextBlock]
    parent: AgentHandle
    persona: str | None = None
    # Checked (plain JSON, detached copy) by `start_continuable`, which refuses anything
    # else with INVALID_DESCRIPTOR; typed loosely here so a bad value reaches that check.
    tool_filter: Any = None
    agent_provider: str | None = None
    agent_model: str | None = None
    inputs: Any = None
    seed_events: list[NewEvent] | None = None
    # A `Budget` (or a mapping of its limits), checked by `start_continuable`, which refuses
    # anything else with INVALID_INPUT; kept in the child's descriptor.
    budget: Any = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompt(cls, value: object) -> object:
        # A blank str stays a str, which the list type then refuses: it is a mistake.
        if isinstance(value, str) and value.strip():
            return [TextBlock(text=value)]
        return value


class ContinuableStart(BaseModel):
    """The ids `start_continuable` returns at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    child_id: str
    task_id: str


class SendResult(BaseModel):
    """How `send_message` delivered: into the running turn, or by starting a new one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    route: Literal["steered", "started"]
    task_id: str = Field(min_length=1)


class ChildView(BaseModel):
    """One child of a parent, as `list_agents` shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    child_id: str
    label: str
    running: bool
    task_id: str | None
    created_at: datetime
    usage: Usage = Field(default_factory=Usage.zero)
    """What its Tasks spent (each its turn's): settled ones as the store keeps
    them, running ones of this runtime so far. `SubagentControl.usage` reads the
    transcript itself."""
