"""`InProcessProvider`: a child agent loop in a thread of this process."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.providers._agent_loop import AgentLoopProvider
from controlplane.providers._child_tools import ChildTool
from controlplane.providers._model import ModelAdapter

__all__ = ["InProcessProvider"]


class InProcessProvider(AgentLoopProvider):
    """Runs each child as an agent loop in its own thread, driven by a `ModelAdapter`.

    A child opens with a fresh conversation: its persona (as the system prompt), its own
    earlier turns (on resume, tool calls and results included) and the prompt. Each tool
    the model calls is run and its result (or error) given back before the next model call;
    steered messages are queued and taken before the next model call too. The turn ends
    when the model answers with no tool call and nothing queued, and after that `steer`
    raises ``NOT_DELIVERED``. The run writes the child's replies
    (``assistant/message``) through the activation's transcript writer; inbound messages are
    written by the control plane, and the loop only reads them.

    Args:
        model: The model every child of this provider talks to.
        name: The provider's key in the registry.
        tools: The tools a child may call (`ChildTool`); the descriptor's ``tool_filter``
            (``allow``/``deny`` lists of names) picks the ones each child sees.
        stop_timeout_s: How long ``dispose`` waits for an aborted loop to stop.
    """

    def __init__(
        self,
        model: ModelAdapter,
        *,
        name: str = "inprocess",
        tools: Sequence[ChildTool] = (),
        stop_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(model, name=name, tools=tools, stop_timeout_s=stop_timeout_s)
