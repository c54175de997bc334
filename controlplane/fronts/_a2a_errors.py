"""The A2A front's boundary: an A2A message checked into our content blocks, and our
refusals translated into the A2A errors that say the same (the code kept in ``data``)."""

from __future__ import annotations

from typing import Final

from a2a.types.a2a_pb2 import Message, Role
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from controlplane.contract import ErrorCode, SubagentControlError, TextBlock
from controlplane.fronts._toolargs import MAX_MESSAGE_CHARS

__all__ = ["a2a_error", "message_blocks"]

_NOT_FOUND: Final = frozenset({ErrorCode.TASK_NOT_FOUND, ErrorCode.CHILD_NOT_FOUND})
_BAD_INPUT: Final = frozenset({ErrorCode.INVALID_INPUT, ErrorCode.INVALID_DESCRIPTOR})
_FAILURES: Final = frozenset(
    {
        ErrorCode.STORE_UNAVAILABLE,
        ErrorCode.PERSISTENCE_UNAVAILABLE,
        ErrorCode.DURABILITY_FAILED,
        ErrorCode.TIMEOUT,
        ErrorCode.INTERNAL,
    }
)


def a2a_error(exc: SubagentControlError) -> A2AError:
    """Our refusal as an A2A error: not found, invalid params, an internal failure, or (a
    refusal of the operation: not delivered, a budget, a conflict…) unsupported operation.
    The message is ours; ``data`` names our code."""
    data = {"code": str(exc.code)}
    if exc.code in _NOT_FOUND:
        return TaskNotFoundError(message=exc.message, data=data)
    if exc.code in _BAD_INPUT:
        return InvalidParamsError(message=exc.message, data=data)
    if exc.code in _FAILURES:
        return InternalError(message=exc.message, data=data)
    return UnsupportedOperationError(message=exc.message, data=data)


def message_blocks(message: Message) -> tuple[TextBlock, ...]:
    """A user message's text parts as our blocks.

    Raises:
        InvalidParamsError: an agent's message, a part that is not text, no text at all,
            or more than `MAX_MESSAGE_CHARS` characters; nothing was delivered.
    """
    if message.role == Role.ROLE_AGENT:
        raise InvalidParamsError(message="the message must be the user's (role ROLE_USER)")
    blocks: list[TextBlock] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind != "text":
            raise InvalidParamsError(
                message=f"part {index} is {kind or 'empty'}: only text parts are taken; "
                "nothing was delivered"
            )
        blocks.append(TextBlock(text=part.text))
    total = sum(len(block.text) for block in blocks)
    if not any(block.text.strip() for block in blocks):
        raise InvalidParamsError(message="the message has no text; nothing was delivered")
    if total > MAX_MESSAGE_CHARS:
        raise InvalidParamsError(
            message=f"the message has {total} characters, over {MAX_MESSAGE_CHARS}; "
            "nothing was delivered"
        )
    return tuple(blocks)
