"""The model adapter contract the built-in providers drive.

A child agent loop (`InProcessProvider`, `ForkProvider`) asks a `ModelAdapter` for one reply
at a time. `ScriptedModel` is the deterministic adapter for the demo and the tests;
`controlplane.models.OpenAIChatModel` speaks the Chat Completions API. A request offers the
child's tools (`ToolDefinition`); a reply may call them (`ToolCall`), and the loop answers
each call with a ``tool`` message before it asks again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.contract import JsonValue, MessageSource, ModelSelector, StopReason, Usage

if TYPE_CHECKING:
    from controlplane.contract import CancelSignal

__all__ = [
    "ChatMessage",
    "ModelAdapter",
    "ModelReply",
    "ModelRequest",
    "ToolCall",
    "ToolDefinition",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ToolCall(BaseModel):
    """One call of a tool, as the model asked for it.

    Attributes:
        id: The model's id for the call; its result answers this id.
        name: The tool's name (possibly one the child does not have).
        arguments: The arguments as the model wrote them: JSON text, not necessarily valid.
            A mapping is accepted and written as JSON.
    """

    model_config = _FROZEN

    id: str
    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_text(cls, value: object) -> object:
        if isinstance(value, dict | list):
            return json.dumps(value, ensure_ascii=False)
        return value


class ToolDefinition(BaseModel):
    """A tool offered to the model: what a Chat Completions ``function`` tool declares.

    Attributes:
        name: The tool's name.
        description: What the tool does, for the model.
        parameters: The JSON schema of its arguments (an ``object`` schema).
    """

    model_config = _FROZEN

    name: str
    description: str = ""
    parameters: dict[str, JsonValue] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    """One message of the conversation a model sees.

    Attributes:
        role: ``user`` for inbound messages (prompts, steering), ``assistant`` for replies,
            ``tool`` for the result of a tool call.
        text: The message text (a tool result's output, or its error as ``error: …``).
        source: Who sent an inbound message, when known (None for replies).
        tool_calls: The tools an ``assistant`` message called, in order.
        tool_call_id: The call a ``tool`` message answers.
    """

    model_config = _FROZEN

    role: Literal["user", "assistant", "tool"]
    text: str
    source: MessageSource | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None


class ModelRequest(BaseModel):
    """Everything a model needs for one reply.

    Attributes:
        system: The system prompt: the child's persona, or None.
        messages: The conversation so far, oldest first.
        model: Which provider and model to run on, or None for the adapter's default.
        tool_filter: The descriptor's tool filter (``{"allow": [...], "deny": [...]}``).
        tools: The tools the child may call (already filtered), in the provider's order.
    """

    model_config = _FROZEN

    system: str | None = None
    messages: list[ChatMessage]
    model: ModelSelector | None = None
    tool_filter: dict[str, JsonValue] | None = None
    tools: list[ToolDefinition] = Field(default_factory=list)


class ModelReply(BaseModel):
    """One reply of a model.

    Attributes:
        text: The reply text (may be empty, e.g. when truncated or when it only calls tools).
        stop_reason: ``completed`` when the model finished its answer; anything else
            (``max-tokens``, ``refusal``, …) ends the child's turn with that reason, unless
            the reply calls tools or a message is queued: then the loop asks again.
        tool_calls: The tools the model calls; the loop runs each and asks again.
        usage: What this call spent, as the server reported it; None when it reported
            nothing (the loop then records the call, and no token counts).
    """

    model_config = _FROZEN

    text: str = ""
    stop_reason: str = StopReason.COMPLETED.value
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage | None = None


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
