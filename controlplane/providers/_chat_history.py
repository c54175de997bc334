"""Rebuilding the conversation a model sees from a child's stored events.

The transcript keeps events in the order they were committed: what the control plane
writes (prompts, steering) interleaved with what the child wrote (replies, tool calls, tool
results). That is not always the order the model saw. A steered message is committed the
moment it is delivered (its sender hears ``steered`` only then), but the live loop shows it
to the model only before its next call: one that lands while the model is answering is
committed before that answer, yet the model read it after. So each ``assistant/message`` the
loop writes says how many of its turn's steering messages its call had read
(``steering_seen``), and the rebuild holds every steering message back until the reply that
read it, or the turn's end. The live model's conversation and the resumed one are the same.
(One exception: a steered message whose record failed to write, ``DURABILITY_FAILED``, was
read by the live model but is not in the transcript, so the count runs one ahead of the
records and a later steering message is placed one reply early.)

A Chat Completions conversation is stricter still: an assistant message that calls tools
must be followed by one ``tool`` message per call before anything else; holding steering
messages back to the next reply keeps them out of an exchange, and a call whose result was
never written (the process died mid-call) is answered with an error. When the child resumes,
the loop writes that call's result late, in the new turn (`controlplane.providers._recovery`);
the rebuild puts it where the placeholder stood, right after the call, as the resumed model
saw it, not after the new turn's prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from controlplane.contract import USAGE, EventKind, SessionEvent, Usage
from controlplane.providers._model import ChatMessage, ToolCall

__all__ = [
    "INTERRUPTED_TOOL_CALL",
    "STEERING_SEEN",
    "TOOL_CALL",
    "TOOL_RESULT",
    "Rebuild",
    "UnansweredCall",
    "chat_history",
    "chat_history_with_unanswered",
    "counted_tool_result",
    "open_turn_history",
    "tool_call_data",
    "tool_message_text",
]

TOOL_CALL = "tool/call"
"""Event kind: a tool call the child's model made (``id``, ``name``, ``arguments``)."""
TOOL_RESULT = "tool/result"
"""Event kind: the result of a tool call (``id`` and ``output``, or ``id`` and ``error``)."""
INTERRUPTED_TOOL_CALL = (
    "the tool call was interrupted: its turn ended before the tool returned, so it may or "
    "may not have run; check its effects before calling it again"
)
"""What the model reads for a call left without a result (its error text)."""
STEERING_SEEN = "steering_seen"
"""``assistant/message`` data key: how many of the turn's steering messages, in the order
they were delivered, the model call that wrote the reply had read. Absent (a reply written by
another provider, or before the key existed): every one committed before the reply."""

_TURN_OPENERS = frozenset({EventKind.TURN_START, EventKind.USER_MESSAGE})
_INBOUND: dict[str, Literal["user"]] = {
    EventKind.USER_MESSAGE: "user",
    EventKind.STEERING_MESSAGE: "user",
}


def tool_message_text(*, output: str | None = None, error: str | None = None) -> str:
    """What the model reads for a tool result: the output, or ``error: <why>``."""
    return f"error: {error}" if error is not None else (output or "")


def counted_tool_result(data: Mapping[str, object]) -> dict[str, object]:
    """A ``tool/result`` event's data with the one tool call it records counted in its
    ``usage`` (our own count, not a server's report)."""
    return {**data, USAGE: Usage(tool_calls=1).stored()}


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


def open_turn_history(
    events: Iterable[SessionEvent],
) -> tuple[list[ChatMessage], list[ChatMessage], int]:
    """The conversation in ``events`` whose last turn is still open (a turn that goes on
    after an approval): its messages, the last turn's waiting calls left
    unanswered; the turn's steering messages its model has not read yet; and how many of
    the turn's steering messages it has read."""
    rebuild = Rebuild()
    rebuild.feed(events)
    return rebuild.messages, rebuild.held, rebuild.steering_placed


@dataclass(frozen=True, slots=True)
class UnansweredCall:
    """A tool call no ``tool/result`` answers, and where its placeholder stands.

    Attributes:
        call: The call, as the conversation carries it.
        at: The index of the ``tool`` message that answers it as interrupted.
    """

    call: ToolCall
    at: int


def chat_history(events: Iterable[SessionEvent]) -> list[ChatMessage]:
    """The conversation held in ``events``.

    Inbound messages become ``user`` messages, replies ``assistant`` messages (carrying the
    tool calls written after them), tool results ``tool`` messages; frames, descriptors and
    unknown kinds are skipped. A call left without a result when its turn (or exchange)
    ended is answered with `INTERRUPTED_TOOL_CALL`, which a result written later for it
    replaces in place; a result for a call already answered is skipped.
    """
    return Rebuild().run(events)


def chat_history_with_unanswered(
    events: Iterable[SessionEvent],
) -> tuple[list[ChatMessage], list[UnansweredCall]]:
    """`chat_history` of ``events``, and the calls in it no result answers, in call order
    (from the same pass)."""
    rebuild = Rebuild()
    messages = rebuild.run(events)
    return messages, rebuild.unanswered()


class Rebuild:
    """One pass over a child's events building its conversation (`chat_history`); it can
    stop after any event and go on from a `copy` (`controlplane.providers._history_cache`)."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.assistant_at: int | None = None  # the reply that tool calls attach to
        self.open_calls: list[ToolCall] = []  # calls still waiting for their result, in order
        # Calls answered as interrupted, by id: where each placeholder stands, oldest first
        # (a model may reuse an id in a later turn), so a late result replaces it in place.
        self.placeholders: dict[str, list[tuple[int, ToolCall]]] = {}
        self.held: list[ChatMessage] = []  # steering messages the model has not read yet
        self.turn: int | None = None
        self.steering_placed = 0  # the turn's steering messages placed so far
        # How many messages were replaced by one of another text (a placeholder by its
        # result): a kept conversation's weight grows by its new messages' alone otherwise.
        self.replaced = 0

    def run(self, events: Iterable[SessionEvent]) -> list[ChatMessage]:
        self.feed(events)
        self.end_turn()
        return self.messages

    def copy(self) -> Rebuild:
        """A rebuild that goes on from where this one stands, sharing none of its lists
        (the messages themselves are frozen, so shared)."""
        other = Rebuild()
        other.messages = list(self.messages)
        other.assistant_at = self.assistant_at
        other.open_calls = list(self.open_calls)
        other.placeholders = {key: list(entries) for key, entries in self.placeholders.items()}
        other.held = list(self.held)
        other.turn = self.turn
        other.steering_placed = self.steering_placed
        other.replaced = self.replaced
        return other

    def ends_turn_at(self, event: SessionEvent) -> bool:
        """Whether feeding ``event`` next ends the turn this rebuild stands in (it belongs
        to another turn, or opens one)."""
        return event.turn != self.turn or event.kind in _TURN_OPENERS

    def feed(self, events: Iterable[SessionEvent]) -> None:
        """Take ``events`` in, leaving the last turn open (its calls unanswered, its
        unread steering held)."""
        for event in events:
            # A turn opens with its frame and its prompt (``user/message``; mid-turn
            # messages are ``steering/message``): the prompt alone marks it in a fork's
            # seed, copied from a parent's history as turn 0, with or without frames.
            if event.turn != self.turn or event.kind in _TURN_OPENERS:
                self.end_turn()  # what a turn's model never read, it left unanswered
                self.turn = event.turn
            data = event.data if isinstance(event.data, dict) else {}
            if event.kind == TOOL_CALL:
                self._call(data)
            elif event.kind == TOOL_RESULT:
                self._result(data)
            elif event.kind == EventKind.ASSISTANT_MESSAGE:
                text = data.get("text")
                if isinstance(text, str):
                    self._reply(text, data.get(STEERING_SEEN))
            elif event.kind in _INBOUND:
                text = data.get("text")
                if isinstance(text, str):
                    message = ChatMessage(role="user", text=text, source=event.source)
                    if event.kind == EventKind.STEERING_MESSAGE:
                        self.held.append(message)  # read at the model's next call
                    else:
                        self.messages.append(message)
                        self.assistant_at = None

    def _reply(self, text: str, seen: object) -> None:
        """Place a reply after the results it answers and the steering its call read."""
        self._answer_open_calls()
        if isinstance(seen, int) and not isinstance(seen, bool):
            self._place(seen - self.steering_placed)
        else:
            self._place(None)
        self.assistant_at = len(self.messages)
        self.messages.append(ChatMessage(role="assistant", text=text))

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
        self.open_calls.append(call)

    def _result(self, data: dict[str, object]) -> None:
        call_id = data.get("id")
        if not isinstance(call_id, str):
            return
        output, error = data.get("output"), data.get("error")
        text = tool_message_text(
            output=output if isinstance(output, str) else None,
            error=error if isinstance(error, str) else None,
        )
        message = ChatMessage(role="tool", text=text, tool_call_id=call_id)
        at = next((n for n, call in enumerate(self.open_calls) if call.id == call_id), None)
        if at is not None:
            del self.open_calls[at]
            self.messages.append(message)
        elif waiting := self.placeholders.get(call_id):
            # Written late, when the child resumed: the model read it where the placeholder
            # stood, right after its call, never after the new turn's prompt.
            self.messages[waiting.pop(0)[0]] = message
            self.replaced += 1
            if not waiting:
                del self.placeholders[call_id]
        # Otherwise a result without its call, or for one already answered: nothing a model
        # could pair it with.

    def _answer_open_calls(self) -> None:
        for call in self.open_calls:
            self.placeholders.setdefault(call.id, []).append((len(self.messages), call))
            self.messages.append(
                ChatMessage(
                    role="tool",
                    text=tool_message_text(error=INTERRUPTED_TOOL_CALL),
                    tool_call_id=call.id,
                )
            )
        self.open_calls = []

    def unanswered(self) -> list[UnansweredCall]:
        """The calls still answered by a placeholder once `run` is over, in call order."""
        waiting = [entry for entries in self.placeholders.values() for entry in entries]
        return [
            UnansweredCall(call=call, at=at)
            for at, call in sorted(waiting, key=lambda entry: entry[0])
        ]

    def _place(self, count: int | None) -> None:
        """Put the first ``count`` held messages (all: None) into the conversation."""
        cut = len(self.held) if count is None else max(0, count)
        placed, self.held = self.held[:cut], self.held[cut:]
        if placed:
            self.messages.extend(placed)
            self.steering_placed += len(placed)
            self.assistant_at = None

    def end_turn(self) -> None:
        """End the current turn: its open calls get placeholders, its held steering is
        placed."""
        self._answer_open_calls()
        self._place(None)
        self.steering_placed = 0
