"""What the store keeps: child headers and append-only session events."""

from __future__ import annotations

import operator
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from controlplane.contract._content import MessageSource

__all__ = [
    "ChildMeta",
    "EventKind",
    "LoadedSession",
    "NewEvent",
    "SessionEvent",
    "utcnow",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


_turn_of = operator.attrgetter("turn")


class EventKind:
    """The stable event kinds (strings; more may be added)."""

    TURN_START: Final = "turn/start"
    USER_MESSAGE: Final = "user/message"
    STEERING_MESSAGE: Final = "steering/message"
    DESCRIPTOR: Final = "subagent/descriptor"
    ASSISTANT_MESSAGE: Final = "assistant/message"
    TURN_END: Final = "turn/end"
    APPROVAL_REQUEST: Final = "approval/request"
    APPROVAL_ANSWER: Final = "approval/answer"
    TASK_RECOVERED: Final = "task/recovered"
    """A running Task's turn taken over by another runtime after its own ended (a
    recovery): ``task_id``, ``runtime_id`` (carries it on), ``from_runtime``,
    ``recovery`` (1, 2, …)."""


class ChildMeta(BaseModel):
    """The durable header of a child session."""

    model_config = _FROZEN

    child_id: str = Field(min_length=1, max_length=200)
    parent_session: str = Field(min_length=1, max_length=200)
    depth: int = Field(ge=1)
    seed_length: int = Field(default=0, ge=0)
    created_at: datetime = Field(default_factory=utcnow)
    label: str | None = Field(default=None, max_length=1000)
    """The label the child was started with (what `list_agents` shows)."""


class NewEvent(BaseModel):
    """An event to append; the store assigns ``seq`` and ``created_at``."""

    model_config = _FROZEN

    kind: str = Field(min_length=1, max_length=200)
    turn: int = Field(ge=0)
    data: Any
    source: MessageSource | None = None


class SessionEvent(BaseModel):
    """A stored event. ``seq`` is 1-based and gapless per child.

    Read-only, ``data`` included: a store keeps the events it decoded and hands the same
    objects to later loads of the child (a turn then decodes only what is new), so a reader
    that wants to change ``data`` copies it first."""

    model_config = _FROZEN

    seq: int
    turn: int
    kind: str
    data: Any
    source: MessageSource | None = None
    created_at: datetime


class LoadedSession(BaseModel):
    """A child's header and its whole transcript, oldest event first."""

    model_config = _FROZEN

    meta: ChildMeta
    events: list[SessionEvent]

    @property
    def seed(self) -> list[SessionEvent]:
        """The events copied from the parent when the child was forked."""
        return self.events[: self.meta.seed_length]

    @property
    def own_events(self) -> list[SessionEvent]:
        """The child's own events, after its seed."""
        return self.events[self.meta.seed_length :]

    @property
    def last_turn(self) -> int:
        """The highest turn number written so far (0 when there is none)."""
        return max(map(_turn_of, self.events), default=0)
