"""The contract `actors/` and `persistence/` build on: types, errors, protocols and the few
helpers every layer shares (the JSON gate, the clock, descriptor folding).

Importing it never loads the facade, the actors or the store, so those packages depend on
the contract and never on each other's internals.
"""

from controlplane._agents import AgentHandle, AgentRegistry
from controlplane._content import MessageSource, ModelSelector, TextBlock, text_of
from controlplane._descriptor import Descriptor, fold_descriptor
from controlplane._errors import ClaimConflict, ErrorCode, SubagentControlError
from controlplane._json import JsonValue, dumps, plain_json, seconds_problem, storable_text
from controlplane._provider import (
    ProviderRegistry,
    ResumeRequest,
    StartRequest,
    StopReason,
    SubagentProvider,
    SubagentResult,
    SubagentRun,
    TranscriptWriter,
)
from controlplane._session import (
    ChildMeta,
    EventKind,
    LoadedSession,
    NewEvent,
    SessionEvent,
    utcnow,
)
from controlplane._signal import CancelSignal
from controlplane._spec import ContinuableStart, ContinuableStartSpec, SendResult
from controlplane._task_types import RuntimeInfo, TaskOutcome, TaskSnapshot, TaskStatus
from controlplane._tasks import TaskNotice, TaskService
from controlplane._telemetry import NO_TELEMETRY, NO_TRACE, ActivationTrace, Origin, Telemetry
from controlplane._tree import ActivationNode, ActorTree, SupervisorNode, SupervisorState

__all__ = [
    "NO_TELEMETRY",
    "NO_TRACE",
    "ActivationNode",
    "ActivationTrace",
    "ActorTree",
    "AgentHandle",
    "AgentRegistry",
    "CancelSignal",
    "ChildMeta",
    "ClaimConflict",
    "ContinuableStart",
    "ContinuableStartSpec",
    "Descriptor",
    "ErrorCode",
    "EventKind",
    "JsonValue",
    "LoadedSession",
    "MessageSource",
    "ModelSelector",
    "NewEvent",
    "Origin",
    "ProviderRegistry",
    "ResumeRequest",
    "RuntimeInfo",
    "SendResult",
    "SessionEvent",
    "StartRequest",
    "StopReason",
    "SubagentControlError",
    "SubagentProvider",
    "SubagentResult",
    "SubagentRun",
    "SupervisorNode",
    "SupervisorState",
    "TaskNotice",
    "TaskOutcome",
    "TaskService",
    "TaskSnapshot",
    "TaskStatus",
    "Telemetry",
    "TextBlock",
    "TranscriptWriter",
    "dumps",
    "fold_descriptor",
    "plain_json",
    "seconds_problem",
    "storable_text",
    "text_of",
    "utcnow",
]
