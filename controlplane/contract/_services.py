"""The runtime's services as the actors see them: their interfaces, and one null object.

The actors call the Task service and the telemetry of the control plane they run in, but
those are built above them (`controlplane.runtime.tasks._tasks.TaskService`,
`controlplane.telemetry`). Typed against these interfaces, `actors/` imports only the contract, so
`import actors` loads neither the runtime nor OpenTelemetry's glue. Each names only what the
actors call; the implementations offer more (the facade and the tools use the rest).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Final, Protocol

from controlplane.contract._agents import AgentHandle
from controlplane.contract._approval import ApprovalDesk, ApprovalTranscript
from controlplane.contract._content import MessageSource, TextBlock
from controlplane.contract._descriptor import Descriptor
from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._run_trace import RunTrace
from controlplane.contract._session import NewEvent
from controlplane.contract._signal import CancelSignal
from controlplane.contract._task_types import TaskOutcome, TaskSnapshot
from controlplane.contract._usage import Usage

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanContext

__all__ = [
    "NO_TRACE",
    "ActivationTrace",
    "AdmissionGate",
    "ApprovalPort",
    "Origin",
    "Requester",
    "TaskService",
    "Telemetry",
    "requester_session",
]

Requester = AgentHandle | str
"""Who asks about a Task: the owner's live handle or its session id."""


def requester_session(requester: object) -> str:
    """The session id a `Requester` names.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for anything but a handle or a string.
    """
    if isinstance(requester, AgentHandle):
        return requester.session_id
    if isinstance(requester, str):
        return requester
    raise SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"requester must be an AgentHandle or a session id, not {type(requester).__name__}",
    )


class Origin:
    """Where a start or a send came from, handed to the activation it admits: the trace
    context it ran under (its own span current in it), when it began
    (`time.perf_counter`), and the caller's own span. In memory; a send forwarded to
    another process carries its ``traceparent`` instead (`Telemetry.carrier`). Immutable
    (a plain class, not a dataclass, so the pydantic messages that carry it check only its
    type). A value, so it lives here:
    the telemetry makes it, the actors carry it, neither needs the other's code."""

    __slots__ = ("caller", "context", "started")

    def __init__(
        self, context: Context | None, started: float, caller: SpanContext | None = None
    ) -> None:
        self.context = context
        self.started = started
        self.caller = caller


class ActivationTrace(RunTrace, abc.ABC):
    """One activation's span and timings, from admission to settlement (implemented by
    `controlplane.telemetry.SpanTrace`; `NO_TRACE` does nothing). Thread-safe: the
    supervisor adds steer events while the activation's thread runs its phases.

    An abstract class, not a Protocol, though it is one in spirit: the pydantic messages
    that carry a trace check it with ``isinstance`` on every activation, which costs about
    0.2 µs against an ABC and 9 µs against a runtime-checkable Protocol (Python 3.11).
    """

    __slots__ = ()

    @abc.abstractmethod
    def loading(self) -> AbstractContextManager[None]:
        """The phase in which a resume reads the child from the store."""

    @abc.abstractmethod
    def calling_provider(self, *, resumed: bool) -> AbstractContextManager[None]:
        """The phase in which the provider is called (a resume's latency ends as it
        begins)."""

    @abc.abstractmethod
    def publishing(self) -> AbstractContextManager[None]:
        """The phase in which the frame (and a new child's header) is written."""

    @abc.abstractmethod
    def disposing(self) -> AbstractContextManager[None]:
        """The phase in which the run is released."""

    @abc.abstractmethod
    def describe(self, descriptor: Descriptor) -> None:
        """Name the provider and model once the descriptor is known."""

    @abc.abstractmethod
    def provider_called(self) -> None:
        """``provider.resume`` is being called."""

    @abc.abstractmethod
    def published(self) -> None:
        """The run is published: the child is durable and takes steers."""

    @abc.abstractmethod
    def steered(
        self, message: Sequence[TextBlock], source_kind: str, sender: object = None
    ) -> None:
        """A message was handed to the running turn; ``sender``: what `sender` answered
        on the thread of the call that sent it."""

    def sender(self) -> object:
        """The span current on the calling thread (a sender's), or None when this
        activation is not traced: `steered` links the two."""
        return None

    def killed(self) -> None:
        """Its Task was killed, on the killing call's thread (the kill's span, or a
        forwarded kill's delivery span, is current there): the trace links the two."""

    @abc.abstractmethod
    def model_call(self, input_tokens: int, output_tokens: int) -> None:
        """A model call's usage was recorded (its server reported tokens): the token
        usage metric counts it."""

    @abc.abstractmethod
    def end(self, outcome: TaskOutcome | None) -> None:
        """The Task settled with ``outcome`` (None: never admitted). Only the first call
        counts."""


class Telemetry(Protocol):
    """The control plane's spans, metrics and lifecycle logs, as the actors use them
    (implemented by `controlplane.telemetry.Telemetry`)."""

    def activation(
        self,
        *,
        task_id: str,
        child_id: str,
        route: str,
        origin: Origin | None,
        chars: int,
        descriptor: Descriptor | None = None,
    ) -> ActivationTrace:
        """Admit an activation: its trace begins, a child of ``origin``."""
        ...

    def supervisors_live(self, delta: int) -> None:
        """Child supervisors started (``delta`` > 0) or stopped (< 0)."""
        ...

    def held_messages(self, delta: int) -> None:
        """Messages began (> 0) or stopped (< 0) waiting for their activation's
        publication."""
        ...

    def scoped(
        self, child_id: str | None, task_id: str | None = None
    ) -> AbstractContextManager[None]:
        """Name the child and Task in every lifecycle line logged on this thread
        meanwhile."""
        ...


class AdmissionGate(Protocol):
    """Concurrency limits as the activation meets them: implemented by
    `controlplane.runtime.spend._admission.Admission`, present only when limits are configured."""

    def wait(self, plan: object, descriptor: Descriptor) -> TaskOutcome | None:
        """Block until the activation ``plan`` (an `actors.ActivationPlan`) holds a slot
        under every limited key its ``descriptor`` falls under; None then (at once when
        none is limited). Otherwise the outcome to settle with instead: ``killed`` when
        its signal aborted while it waited, ``interrupted`` when its Task was settled
        elsewhere meanwhile."""
        ...

    def release(self, task_id: str) -> None:
        """The activation settled: free its slot (or its place) for the next in line."""
        ...


class ActivationFacts(Protocol):
    """What the Task ledger, an activation's approval desk and its budget gate read of its
    published view (`actors.ActivationView`, frozen): whose Task it is, for which child,
    parent session and claim, and where the activation is in its life."""

    @property
    def task_id(self) -> str: ...

    @property
    def child_id(self) -> str: ...

    @property
    def owner_session(self) -> str:
        """The session that owns its Task: the child's parent."""
        ...

    @property
    def fence(self) -> int | None:
        """The fencing number of this runtime's claim on the child (None: unclaimed)."""
        ...

    @property
    def phase(self) -> str: ...


class TaskService(Protocol):
    """The Task service as the actors use it: admit and settle the Tasks of their
    activations, and follow each activation's published view (implemented by
    `controlplane.runtime.tasks._tasks.TaskService`; callers see it through the smaller
    `control.tasks`)."""

    def claim(
        self,
        *,
        label: str,
        owner: Requester,
        child_id: str,
        signal: CancelSignal,
        queued: bool = False,
        opening: Callable[[TaskSnapshot], Sequence[NewEvent]] | None = None,
    ) -> tuple[TaskSnapshot, int | None]:
        """Register a resume's Task (``running``, or ``queued`` until its admission
        decides) and write it to the store, admitted with the claim on its child and
        ``opening``, the events that open its turn (durable before ``started``); returns
        its snapshot and the claim's fencing number, which the activation's plan carries
        from then on."""
        ...

    def discard(self, task_id: str) -> None:
        """Forget a Task that never ran."""
        ...

    def settle(
        self,
        task_id: str,
        outcome: TaskOutcome,
        *,
        at: datetime | None = None,
        persisted: bool = False,
    ) -> TaskSnapshot:
        """Record a terminal outcome; the Task is not released yet."""
        ...

    def on_view(self, view: ActivationFacts) -> None:
        """The activation's supervisor published ``view``: the ledger follows its phase
        (``parking``: a kill now reaches the Task in the store too; ``parked`` or
        ``handed_over``: gone from this runtime, the Task goes on in the store;
        ``ended``: gone, so ``wait`` returns from here on)."""
        ...

    def meter(self, task_id: str, spent: Callable[[], Usage]) -> None:
        """Read a running Task's ``usage`` from ``spent`` (what its turn has written so
        far, from any thread) until it settles."""
        ...

    def take_over_parked(self, task: TaskSnapshot, signal: CancelSignal) -> None:
        """Hold a parked Task this runtime now continues (same id, same turn)."""
        ...


class ApprovalPort(Protocol):
    """Approvals as the actors meet them: implemented by
    `controlplane.runtime.approvals._approvals.Approvals`, present when the control plane has a
    store."""

    def desk(
        self,
        view: ActivationFacts,
        *,
        provider: str,
        signal: CancelSignal,
        transcript: ApprovalTranscript,
    ) -> ApprovalDesk:
        """The desk where the run of the activation ``view`` shows asks
        (``request.approvals``), writing through its ``transcript`` (whose turn the
        requests name); ``provider`` is the child's (only a runtime that has it continues
        the Task once parked)."""
        ...

    def claim_parked(self, task_id: str, child_id: str) -> tuple[TaskSnapshot, int] | None:
        """Claim a child whose Task waits parked (or left waiting by a dead runtime), so
        this runtime continues that Task: its snapshot and the new fencing number; None
        when another runtime got it first, or it settled.

        Raises:
            SubagentControlError: ``UNKNOWN_PROVIDER`` when this runtime does not have the
                child's provider (nothing claimed: a runtime that has it continues it)."""
        ...

    def steer_parked(
        self, task_id: str, child_id: str, message: Sequence[TextBlock], source: MessageSource
    ) -> bool:
        """Write a message to a child whose Task waits parked into that Task's open turn
        (``steering/message``), for the runtime that continues it, which has the child's
        provider, to read (work goes where the provider is); whether it was
        written (False: the Task is no longer parked: not delivered, retry)."""
        ...


_NO_PHASE: Final = contextlib.nullcontext()  # reusable: it holds no state


class _NoTrace(ActivationTrace):
    """The `ActivationTrace` of an activation nobody admitted through a `Telemetry` (a
    plan built by hand): every hook does nothing."""

    __slots__ = ()

    def loading(self) -> AbstractContextManager[None]:
        return _NO_PHASE

    def calling_provider(self, *, resumed: bool) -> AbstractContextManager[None]:
        return _NO_PHASE

    def publishing(self) -> AbstractContextManager[None]:
        return _NO_PHASE

    def disposing(self) -> AbstractContextManager[None]:
        return _NO_PHASE

    def describe(self, descriptor: Descriptor) -> None:
        return None

    def provider_called(self) -> None:
        return None

    def published(self) -> None:
        return None

    def steered(
        self, message: Sequence[TextBlock], source_kind: str, sender: object = None
    ) -> None:
        return None

    def model_call(self, input_tokens: int, output_tokens: int) -> None:
        return None

    def end(self, outcome: TaskOutcome | None) -> None:
        return None


NO_TRACE: Final[ActivationTrace] = _NoTrace()
"""The null `ActivationTrace`: the default of an `ActivationPlan` built by hand."""
