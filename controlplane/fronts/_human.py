"""Human input: a person watching a parent sends its child a message.

It goes through the same `send_message` as the parent model's tool, under the parent's live
session, marked ``MessageSource(kind="human")``: a human message that joins a running turn
shares that turn's Task, result and kill with the parent's own messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.contract import (
    AgentHandle,
    ErrorCode,
    MessageSource,
    SendResult,
    SubagentControlError,
    TextBlock,
)

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["HUMAN", "HumanInput"]

HUMAN = "human"
"""The source kind of a human's message."""


class HumanInput:
    """Sends a human's messages to the children of one parent session.

    Args:
        control: The control plane.
        parent: The parent, as a handle or a session id. It is looked up at each send, so
            the adapter keeps working when the parent session is reloaded (registered
            again) after it was disposed.
    """

    def __init__(self, control: SubagentControl, parent: AgentHandle | str) -> None:
        if isinstance(parent, AgentHandle):
            session_id = parent.session_id
        elif isinstance(parent, str) and parent:
            session_id = parent
        else:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                "parent must be an AgentHandle or a non-empty session id",
            )
        self._control = control
        self._session_id = session_id

    @property
    def parent_session(self) -> str:
        """The parent session the messages are sent under."""
        return self._session_id

    def send(self, child_id: str, text: str, *, sender_id: str | None = None) -> SendResult:
        """Send ``text`` to the child ``child_id`` as a human message.

        Args:
            child_id: A child of the parent.
            text: The message.
            sender_id: Who the human is (a user or session id), recorded in the source.

        Returns:
            How it was delivered: ``steered`` into the running turn, or ``started`` a new one.

        Raises:
            SubagentControlError: ``UNAUTHORIZED`` when the parent session is not live (load
                it first), or anything `SubagentControl.send_message` raises; a raise means
                the message was not delivered (``DURABILITY_FAILED`` excepted).
        """
        if not isinstance(text, str):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a human message is text, not {type(text).__name__}; nothing was sent",
            )
        parent = self._control.agents.get(self._session_id)
        if parent is None:
            raise SubagentControlError(
                ErrorCode.UNAUTHORIZED,
                f"parent session {self._session_id!r} is not live; load (register) it, then "
                "send again — the message was not delivered",
                child_id=child_id if isinstance(child_id, str) else None,
            )
        return self._control.send_message(
            parent,
            child_id,
            [TextBlock(text=text)],
            MessageSource(kind=HUMAN, sender_session_id=sender_id),
        )
