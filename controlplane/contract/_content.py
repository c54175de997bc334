"""Message content, message sources and model selectors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ContentBlock", "MessageSource", "ModelSelector", "TextBlock", "text_of"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TextBlock(BaseModel):
    """A block of text in a prompt, a steered message or a model's answer."""

    model_config = _FROZEN

    type: Literal["text"] = "text"
    text: str


ContentBlock = TextBlock
"""The content blocks the control plane carries (text only in this version)."""


class MessageSource(BaseModel):
    """Who sent a message: ``user``, ``coordinator`` (the parent model), ``human``, …"""

    model_config = _FROZEN

    kind: str = Field(min_length=1, max_length=64)
    sender_session_id: str | None = None


class ModelSelector(BaseModel):
    """Which provider and model an agent runs on."""

    model_config = _FROZEN

    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)


def text_of(blocks: Iterable[TextBlock]) -> str:
    """Concatenate the text of content blocks."""
    return "".join(block.text for block in blocks)
