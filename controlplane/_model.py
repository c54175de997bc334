"""The model adapter contract the built-in providers drive.

A child agent loop (`InProcessProvider`, `ForkProvider`) asks a `ModelAdapter` for one reply
at a time. `ScriptedModel` is the deterministic adapter for the demo and the tests; a real
adapter (an HTTP client for a hosted model) implements the same Protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from controlplane._content import MessageSource, ModelSelector
from controlplane._json import JsonValue
from controlplane._provider import StopReason

if TYPE_CHECKING:
    from controlplane._signal import CancelSignal

__all__ = ["ChatMessage", "ModelAdapter", "ModelReply", "ModelRequest"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ChatMessage(BaseModel):
    """One message of the conversation a model sees.

    Attributes:
        role: ``user`` for inbound messages (prompts, steering), ``assistant`` for replies.
        text: The message text.
        source: Who sent an inbound message, when known (None for replies).
    """

    model_config = _FROZEN

    role: Literal["user", "assistant"]
    text: str
    source: MessageSource | None = None


class ModelRequest(BaseModel):
    """Everything a model needs for one reply.

    Attributes:
        system: The system prompt: the child's persona, or None.
        messages: The conversation so far, oldest first.
        model: Which provider and model to run on, or None for the adapter's default.
        tool_filter: The descriptor's tool filter (``{"allow": [...], "deny": [...]}``).
    """

    model_config = _FROZEN

    system: str | None = None
    messages: list[ChatMessage]
    model: ModelSelector | None = None
    tool_filter: dict[str, JsonValue] | None = None


class ModelReply(BaseModel):
    """One reply of a model.

    Attributes:
        text: The reply text (may be empty, e.g. when truncated).
        stop_reason: ``completed`` when the model finished its answer; anything else
            (``max-tokens``, ``refusal``, …) ends the child's turn with that reason.
    """

    model_config = _FROZEN

    text: str
    stop_reason: str = StopReason.COMPLETED.value


@runtime_checkable
class ModelAdapter(Protocol):
    """A model the child agent loop can ask for replies.

    Implementations are called from the child's loop thread, possibly for several children
    at once, so they must be thread-safe.
    """

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        """Return the model's reply to ``request``.

        Must return or raise promptly once ``signal`` aborts (a real adapter closes its
        HTTP stream from ``signal.add_callback``): the control plane's kill and close wait
        for the loop to stop.

        Raises:
            SubagentControlError: ``CANCELLED`` when the call was interrupted by ``signal``;
                any other exception fails the child's turn with its text.
        """
        ...
