"""The child agent loop shared by the built-in providers (`inprocess`, `fork`).

One activation is one turn of the loop, in its own thread: ask the model, write its reply
through the activation's transcript writer, run the tools it called (writing each call and
its result), take any steered messages and ask again, until the model answers with no tool
call and nothing queued. Each reply's event carries what its model call spent, and each
tool result counts its call (`controlplane.contract.usage_data`), so a child's spend is
durable with its messages. The providers differ only in the conversation a child opens
with (`AgentLoopProvider._opening`).

The turn itself, its thread and its lock, is `AgentLoopRun`
(`controlplane.providers._agent_run`); this module builds each turn's history and starts it.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    EventKind,
    ModelSelector,
    ResumeRequest,
    StartRequest,
    SubagentControlError,
    SubagentRun,
    text_of,
)
from controlplane.providers._agent_run import AgentLoopRun
from controlplane.providers._approval_calls import (
    Continuation,
    continuation_of,
    waits_on_request,
)
from controlplane.providers._chat_history import (
    UnansweredCall,
    chat_history,
    open_turn_history,
)
from controlplane.providers._child_tools import ChildTool, select_tools
from controlplane.providers._history_cache import HistoryCache
from controlplane.providers._model import ChatMessage, ModelAdapter, ModelRequest
from controlplane.providers._recovery import resumed_history

__all__ = [
    "THREAD_PREFIX",
    "AgentLoopProvider",
    "AgentLoopRun",
    "chat_history",
    "start_cancelled",
]

THREAD_PREFIX = "subagent-loop"
"""Every loop thread's name starts with this (``subagent-loop:<provider>:<child_id>``)."""


def start_cancelled(child_id: str, reason: str | None, left: str) -> SubagentControlError:
    """The ``CANCELLED`` error a provider's start raises once it has rolled back."""
    return SubagentControlError(
        ErrorCode.CANCELLED,
        f"child {child_id} was not started: its activation was cancelled ({reason}); {left}",
        child_id=child_id,
    )


def _selector(request: StartRequest | ResumeRequest) -> ModelSelector | None:
    # The descriptor is the child's snapshot; the parent's selector is only a fallback for a
    # descriptor that declares none (the control plane already folds it in at start).
    descriptor = request.descriptor
    if descriptor.agent_provider and descriptor.agent_model:
        return ModelSelector(provider=descriptor.agent_provider, model=descriptor.agent_model)
    return request.parent.model


class AgentLoopProvider:
    """A provider whose child runs the agent loop in a thread of this process.

    Args:
        model: The model every child of this provider talks to.
        name: The provider's key in the registry.
        tools: The tools a child may call; the descriptor's ``tool_filter`` picks among them.
        stop_timeout_s: How long `dispose` waits for an aborted loop to stop.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for an empty name or two tools of one name.
    """

    def __init__(
        self,
        model: ModelAdapter,
        *,
        name: str,
        tools: Sequence[ChildTool] = (),
        stop_timeout_s: float = 30.0,
    ) -> None:
        if not name:
            raise SubagentControlError(ErrorCode.INVALID_INPUT, "a provider needs a non-empty name")
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"tool names must be distinct; given twice: {twice}"
            )
        self._model = model
        self._name = name
        self._tools = tuple(tools)
        self._stop_timeout_s = stop_timeout_s
        # Each child's conversation as its last resume rebuilt it: a resume rebuilds only
        # the events written since (checked against the events the store just read).
        self._histories = HistoryCache()

    recovers_turns = True
    """A turn whose runtime ended is carried on by another runtime from its events:
    the loop runs in the runtime's process, and everything it did is in
    the transcript."""

    @property
    def name(self) -> str:
        """The provider's key in the provider registry."""
        return self._name

    @property
    def model(self) -> ModelAdapter:
        """The model adapter the children talk to."""
        return self._model

    @property
    def tools(self) -> tuple[ChildTool, ...]:
        """Every tool of this provider, before a child's tool filter."""
        return self._tools

    def start(self, request: StartRequest, signal: CancelSignal) -> SubagentRun:
        """Start the child's first turn on a thread of its own and return its run at once.

        Raises:
            SubagentControlError: ``CANCELLED`` when ``signal`` aborted first (nothing is left
                running or registered); ``OWNERSHIP_CONFLICT`` when an agent with the child's
                id is already live.
        """
        return self._launch(request, signal, self._opening(request))

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> SubagentRun:
        """Continue the child in a new turn, from its opening and its own earlier events.

        Before the turn's first model call, each tool call of those events that no result
        answers is answered (`controlplane.providers._recovery`).

        Raises:
            SubagentControlError: as for `start`.
        """
        if request.open_turn and waits_on_request(request.open_turn):
            return self._launch(request, signal, [])  # the history is read with its open turn
        if request.open_turn:
            # A turn recovered from a runtime that ended: its prompt,
            # replies, results and steering are in its events; the calls it left open are
            # answered as a resume's are, and the model is asked again.
            events = [*request.events, *request.open_turn]
            history, unanswered = resumed_history(
                self._opening(request), events, cache=self._histories, child_id=request.child_id
            )
            seen = sum(1 for e in request.open_turn if e.kind == EventKind.STEERING_MESSAGE)
            return self._launch(request, signal, history, unanswered, recovered_seen=seen)
        history, unanswered = resumed_history(
            self._opening(request),
            request.events,
            cache=self._histories,
            child_id=request.child_id,
        )
        return self._launch(request, signal, history, unanswered)

    def _opening(self, request: StartRequest | ResumeRequest) -> list[ChatMessage]:
        """The conversation a child opens with, before its own events."""
        return []

    def _launch(
        self,
        request: StartRequest | ResumeRequest,
        signal: CancelSignal,
        history: list[ChatMessage],
        unanswered: Sequence[UnansweredCall] = (),
        *,
        recovered_seen: int | None = None,
    ) -> AgentLoopRun:
        self._raise_if_cancelled(request, signal)
        # Filtered again at every activation: a resumed child sees what its descriptor allows.
        tools = select_tools(self._tools, request.descriptor.tool_filter)
        continuation: Continuation | None = None
        unread: list[ChatMessage] = []
        seen = 0
        if recovered_seen is not None:
            seen = recovered_seen  # its prompt and steering are in the rebuilt history
        elif isinstance(request, ResumeRequest) and request.open_turn:
            # A parked turn goes on: its prompt is in its events, read with them.
            opened, unread, seen = open_turn_history([*request.events, *request.open_turn])
            if request.prompt:  # sent to it while it waited, written after its events
                unread.append(
                    ChatMessage(role="user", text=text_of(request.prompt), source=request.source)
                )
            history = self._opening(request) + opened
            continuation = continuation_of(request.open_turn)
        else:
            history.append(
                ChatMessage(role="user", text=text_of(request.prompt), source=request.source)
            )
        selector = _selector(request)
        template = ModelRequest(
            system=request.descriptor.persona,
            messages=history,
            model=selector,
            tool_filter=request.descriptor.tool_filter,
            tools=[tool.definition for tool in tools],
        )
        agent = request.parent.registry.register(
            request.child_id, model=selector, depth=request.depth
        )
        run = AgentLoopRun(
            child_id=request.child_id,
            local_agent=agent,
            model=self._model,
            template=template,
            transcript=request.transcript,
            thread_name=f"{THREAD_PREFIX}:{self._name}:{request.child_id}",
            stop_timeout_s=self._stop_timeout_s,
            tools=tools,
            gate=request.gate,
            approvals=request.approvals,
            continuation=continuation,
            unread=unread,
            seen=seen,
            unanswered=unanswered,
            trace=request.trace,
        )
        try:
            # Roll back (no thread, agent disposed) for an abort that came while registering.
            self._raise_if_cancelled(request, signal)
            run._begin(signal)
        except BaseException:
            run.dispose()
            raise
        return run

    @staticmethod
    def _raise_if_cancelled(request: StartRequest | ResumeRequest, signal: CancelSignal) -> None:
        if signal.aborted:
            raise start_cancelled(request.child_id, signal.reason, "nothing is left running")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} model={self._model!r}>"
