"""The provider contract: how a child is started or resumed, and what a run exposes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from controlplane.contract._agents import AgentHandle
from controlplane.contract._approval import ApprovalDesk
from controlplane.contract._budget import SpendGate
from controlplane.contract._content import MessageSource, TextBlock
from controlplane.contract._descriptor import Descriptor
from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._run_trace import NO_RUN_TRACE, RunTrace
from controlplane.contract._session import SessionEvent

if TYPE_CHECKING:
    from controlplane.contract._signal import CancelSignal

__all__ = [
    "ProviderRegistry",
    "ResumeRequest",
    "StartRequest",
    "StopReason",
    "SubagentProvider",
    "SubagentResult",
    "SubagentRun",
    "TranscriptWriter",
]


class StopReason(StrEnum):
    """Why a run stopped; providers may report other strings too."""

    COMPLETED = "completed"
    ABORTED = "aborted"
    ERROR = "error"
    MAX_TOKENS = "max-tokens"
    REFUSAL = "refusal"
    INPUT_REQUIRED = "input_required"
    """The run parked: it waits for the answer to an approval request and holds no thread;
    its Task stays ``input_required`` and the answer continues it."""


class SubagentResult(BaseModel):
    """What a run's ``result()`` returns."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stop_reason: StopReason | str
    output: list[TextBlock] = []


@runtime_checkable
class TranscriptWriter(Protocol):
    """Where a provider writes what the child produces (``assistant/message``, …).

    Writes are ordered and stamped with the activation's turn. Before publication they are
    held and written right after the activation's frame; if the activation never publishes
    they are dropped with it. Inbound messages (prompt, steering) are written by the control
    plane, never through this writer.
    """

    @property
    def turn(self) -> int:
        """The turn number of this activation."""
        ...

    def append(
        self, kind: str, data: Any, *, source: MessageSource | None = None, last: bool = False
    ) -> None:
        """Append one event to the child's transcript (blocking until durable if published).

        With ``last``, the event is the run's last of the turn (its final reply, nothing
        steered left to answer): the writer may hold it and write it in the transaction that
        ends the turn and settles its Task, so the two land together or not at all, and one
        commit fewer is paid. It returns at once then; nothing is acknowledged before that
        commit. A run writes nothing after it.

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for non-JSON data, ``DURABILITY_FAILED``
                when the store keeps failing after retries.
        """
        ...


class _RequestBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    child_id: str
    prompt: list[TextBlock]
    source: MessageSource
    parent: AgentHandle
    descriptor: Descriptor
    depth: int
    transcript: TranscriptWriter
    seed: list[SessionEvent] = []
    """Events copied from the parent's history at fork time (empty when not forked)."""
    gate: SpendGate | None = None
    """What the run asks before each model call and tool call (its budgets): a call it
    refuses must not start. None when nothing limits the run."""
    approvals: ApprovalDesk | None = None
    """Where the run asks before a tool call that needs approval. None when
    the control plane has no store to keep requests in."""
    trace: RunTrace = NO_RUN_TRACE
    """The activation's trace, for the run's own threads (`RunTrace`): a no-op without
    OpenTelemetry."""


class StartRequest(_RequestBase):
    """The first activation of a child."""


class ResumeRequest(_RequestBase):
    """A later activation: ``events`` are the child's own events from the earlier turns."""

    events: list[SessionEvent]
    open_turn: list[SessionEvent] = []
    """A continued turn (a parked Task answered, killed or steered): the events
    its open turn has so far, from its ``turn/start``. The run goes on in that turn — its
    prompt is among them — and never opens a new one. ``prompt`` is then empty, or the
    message sent to the waiting child that continued it, already written into the turn
    after these events as a ``steering/message`` (read before the model goes on). Empty
    for a new turn."""


@runtime_checkable
class SubagentRun(Protocol):
    """A published run: one activation's handle on the provider's work.

    ``steer`` is either a callable ``steer(message, source)`` that raises once the turn has
    settled, or None for providers without live delivery.
    """

    child_id: str
    local_agent: AgentHandle | None
    steer: Callable[[Sequence[TextBlock], MessageSource], None] | None

    def result(self) -> SubagentResult:
        """Block until the turn ends and return its result."""
        ...

    def dispose(self) -> None:
        """Release everything the run holds; after it returns the run is quiescent."""
        ...


@runtime_checkable
class SubagentProvider(Protocol):
    """Starts and resumes children. ``name`` is its key in the provider registry.

    Before it returns a run, ``start``/``resume`` must watch ``signal``: on abort they roll
    back to quiescence and raise. After publication the signal cancels the run.
    """

    @property
    def name(self) -> str: ...

    def start(self, request: StartRequest, signal: CancelSignal) -> SubagentRun: ...

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> SubagentRun: ...


class ProviderRegistry:
    """Providers by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._providers: dict[str, SubagentProvider] = {}
        self._listeners: list[Callable[[str], None]] = []

    def on_register(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` after each registration (the runtime looks then for
        Tasks this provider lets it carry on after their runtime ended). It must not block."""
        with self._lock:
            self._listeners.append(listener)

    def register(self, provider: SubagentProvider) -> None:
        """Register (or replace) ``provider`` under ``provider.name``."""
        name = getattr(provider, "name", None)
        if not isinstance(name, str) or not name:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "a provider needs a non-empty string `name`"
            )
        with self._lock:
            self._providers[name] = provider
            listeners = list(self._listeners)
        for listener in listeners:
            listener(name)

    def get(self, name: str) -> SubagentProvider:
        """The provider registered as ``name``.

        Raises:
            SubagentControlError: ``UNKNOWN_PROVIDER``.
        """
        provider = self._providers.get(name)
        if provider is None:
            known = ", ".join(sorted(self._providers)) or "none"
            raise SubagentControlError(
                ErrorCode.UNKNOWN_PROVIDER,
                f"no provider named {name!r} is registered (registered: {known})",
            )
        return provider

    def names(self) -> list[str]:
        """The registered provider names, sorted."""
        return sorted(self._providers)
