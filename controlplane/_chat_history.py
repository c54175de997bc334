"""Rebuilding the conversation a model sees from a child's stored events.

The transcript interleaves what the control plane writes (prompts, steering) with what the
child wrote (replies, tool calls, tool results), in the order things happened. A Chat
Completions conversation is stricter: an assistant message that calls tools must be followed
by one ``tool`` message per call before anything else. So a message that arrived while tools
ran is placed after the results (the live loop showed it to the model at that point too), and
a call whose result was never written (the process died mid-call) is answered with an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Literal

from controlplane._model import ChatMessage, ToolCall
from controlplane._session import EventKind, SessionEvent

__all__ = [
    "INTERRUPTED_TOOL_CALL",
    "TOOL_CALL",
    "TOOL_RESULT",
    "chat_history",
    "tool_call_data",
    "tool_message_text",
]

TOOL_CALL = "tool/call"
"""Event kind: a tool call the child's model made (``id``, ``name``, ``arguments``)."""
TOOL_RESULT = "tool/result"
"""Event kind: the result of a tool call (``id`` and ``output``, or ``id`` and ``error``)."""
INTERRUPTED_TOOL_CALL = "the tool call was interrupted before it returned a result"

_INBOUND: dict[str, Literal["user"]] = {
    EventKind.USER_MESSAGE: "user",
    EventKind.STEERING_MESSAGE: "user",
}


def tool_message_text(*, output: str | None = None, error: str | None = None) -> str:
    """What the model reads for a tool result: the output, or ``error: <why>``."""
    return f"error: {error}" if error is not None else (output or "")


def tool_call_data(call: ToolCall) -> dict[str, object]:
    """The ``tool/call`` event's data: the arguments as JSON when they parse, else as text.

    Whatever the model wrote is made storable: a lone surrogate (which JSON can escape but
    UTF-8 cannot hold) becomes ``?`` rather than failing the write, and the turn with it.
    """
    try:
        arguments: object = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    data = {"id": call.id, "name": call.name, "arguments": arguments}
    text = json.dumps(data, ensure_ascii=False)
    if text.isascii():
        return data
    stored: dict[str, object] = json.loads(text.encode("utf-8", "replace").decode("utf-8"))
    return stored


def chat_history(events: Iterable[SessionEvent]) -> list[ChatMessage]:
    """The conversation held in ``events``.

    Inbound messages become ``user`` messages, replies ``assistant`` messages (carrying the
    tool calls written after them), tool results ``tool`` messages; frames, descriptors and
    unknown kinds are skipped.
    """
    return _Rebuild().run(events)


class _Rebuild:
    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.assistant_at: int | None = None  # the reply that tool calls attach to
        self.open_calls: list[str] = []  # calls still waiting for their result, in order
        self.held: list[ChatMessage] = []  # inbound messages that arrived mid-exchange

    def run(self, events: Iterable[SessionEvent]) -> list[ChatMessage]:
        for event in events:
            data = event.data if isinstance(event.data, dict) else {}
            if event.kind == TOOL_CALL:
                self._call(data)
            elif event.kind == TOOL_RESULT:
                self._result(data)
            elif event.kind == EventKind.ASSISTANT_MESSAGE:
                text = data.get("text")
                if isinstance(text, str):
                    self._close_exchange()
                    self.assistant_at = len(self.messages)
                    self.messages.append(ChatMessage(role="assistant", text=text))
            elif event.kind in _INBOUND:
                text = data.get("text")
                if isinstance(text, str):
                    message = ChatMessage(role="user", text=text, source=event.source)
                    (self.held if self.open_calls else self.messages).append(message)
                    if not self.open_calls:
                        self.assistant_at = None
        self._close_exchange()
        return self.messages

    def _call(self, data: dict[str, object]) -> None:
        call_id, name = data.get("id"), data.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            return
        arguments = data.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call = ToolCall(id=call_id, name=name, arguments=text)
        if self.assistant_at is None:
            self.assistant_at = len(self.messages)
            self.messages.append(ChatMessage(role="assistant", text=""))
        reply = self.messages[self.assistant_at]
        self.messages[self.assistant_at] = reply.model_copy(
            update={"tool_calls": [*reply.tool_calls, call]}
        )
        self.open_calls.append(call_id)

    def _result(self, data: dict[str, object]) -> None:
        call_id = data.get("id")
        if call_id not in self.open_calls:
            return  # a result without its call: nothing a model could pair it with
        assert isinstance(call_id, str)
        output, error = data.get("output"), data.get("error")
        text = tool_message_text(
            output=output if isinstance(output, str) else None,
            error=error if isinstance(error, str) else None,
        )
        self.open_calls.remove(call_id)
        self.messages.append(ChatMessage(role="tool", text=text, tool_call_id=call_id))
        if not self.open_calls:
            self._flush_held()

    def _close_exchange(self) -> None:
        for call_id in self.open_calls:
            self.messages.append(
                ChatMessage(
                    role="tool",
                    text=tool_message_text(error=INTERRUPTED_TOOL_CALL),
                    tool_call_id=call_id,
                )
            )
        self.open_calls = []
        self._flush_held()

    def _flush_held(self) -> None:
        if self.held:
            self.messages.extend(self.held)
            self.held = []
            self.assistant_at = None
