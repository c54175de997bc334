"""`ForkProvider`: an in-process child that starts from a copy of its parent's history."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.contract import ResumeRequest, StartRequest
from controlplane.providers._agent_loop import AgentLoopProvider, chat_history
from controlplane.providers._child_tools import ChildTool
from controlplane.providers._model import ChatMessage, ModelAdapter

__all__ = ["ForkProvider"]


class ForkProvider(AgentLoopProvider):
    """Like `InProcessProvider`, but the child's conversation opens with its seed.

    The seed is the parent's history copied at fork time (``seed_events`` of the start
    spec), which the control plane stores once as the child's first events. Every turn, the
    first and each resumed one, opens with ``request.seed``, that stored copy: a resumed
    child never sees what its parent did after the fork.

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
        name: str = "fork",
        tools: Sequence[ChildTool] = (),
        stop_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(model, name=name, tools=tools, stop_timeout_s=stop_timeout_s)

    def _opening(self, request: StartRequest | ResumeRequest) -> list[ChatMessage]:
        return chat_history(request.seed)
