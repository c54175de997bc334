"""The contract every layer builds on: types, errors, Protocols, and the few helpers every
layer shares (the JSON gate, the clock, descriptor folding, `text_of`).

It sits at the bottom: it imports nothing of ours outside itself, so `persistence/` and
`actors/` (and the runtime above them) depend on it and never on each other's internals.
The services the actors call but the runtime builds (the Task service, the telemetry) are
interfaces here (the Protocols `TaskService` and `Telemetry`, the abstract
`ActivationTrace`); their implementations live in `controlplane.runtime.tasks._tasks` and
`controlplane.telemetry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.contract._lazy import loaded_on_first_use

if TYPE_CHECKING:
    from controlplane.contract._agents import AgentHandle, AgentRegistry
    from controlplane.contract._approval import (
        ApprovalAnswer,
        ApprovalDesk,
        ApprovalPolicy,
        ApprovalRequest,
        ApprovalState,
        ApprovalTranscript,
    )
    from controlplane.contract._budget import (
        BUDGET_EXHAUSTED_STATUS,
        LIMITS,
        MODEL_CALL,
        TOOL_CALL,
        TOOL_ROUND,
        Budget,
        BudgetPort,
        FencedCall,
        SpendGate,
        Spent,
        TurnGate,
        budget_of,
        limit_text,
        spent_in,
    )
    from controlplane.contract._content import (
        ContentBlock,
        MessageSource,
        ModelSelector,
        TextBlock,
        text_of,
    )
    from controlplane.contract._descriptor import Descriptor, fold_descriptor
    from controlplane.contract._errors import (
        ClaimConflict,
        ErrorCode,
        ParkedTask,
        SubagentControlError,
    )
    from controlplane.contract._idle_threads import IdleThreads
    from controlplane.contract._json import (
        JsonValue,
        count_problem,
        dumps,
        plain_json,
        seconds_problem,
        storable_text,
    )
    from controlplane.contract._price import Price, Prices
    from controlplane.contract._provider import (
        ProviderRegistry,
        ResumeRequest,
        StartRequest,
        StopReason,
        SubagentProvider,
        SubagentResult,
        SubagentRun,
        TranscriptWriter,
    )
    from controlplane.contract._run_trace import NO_RUN_TRACE, ModelCallTrace, RunTrace, Suspended
    from controlplane.contract._services import (
        NO_TRACE,
        ActivationFacts,
        ActivationTrace,
        AdmissionGate,
        ApprovalPort,
        Origin,
        Requester,
        TaskService,
        Telemetry,
        requester_session,
    )
    from controlplane.contract._session import (
        ChildMeta,
        EventKind,
        LoadedSession,
        NewEvent,
        SessionEvent,
        utcnow,
    )
    from controlplane.contract._signal import CancelSignal, LazyEvent
    from controlplane.contract._spec import (
        ChildView,
        ContinuableStart,
        ContinuableStartSpec,
        SendResult,
    )
    from controlplane.contract._task_types import (
        RuntimeInfo,
        TaskNotice,
        TaskOutcome,
        TaskSnapshot,
        TaskStatus,
    )
    from controlplane.contract._text import escape_controls
    from controlplane.contract._tree import (
        ActivationNode,
        ActorTree,
        ForwardedNode,
        SupervisorNode,
        SupervisorState,
    )
    from controlplane.contract._usage import (
        USAGE,
        USAGE_REPORTED,
        Usage,
        UsageCounts,
        read_usage,
        usage_counts,
        usage_data,
        usage_of,
    )

__all__ = [
    "BUDGET_EXHAUSTED_STATUS",
    "LIMITS",
    "MODEL_CALL",
    "NO_RUN_TRACE",
    "NO_TRACE",
    "TOOL_CALL",
    "TOOL_ROUND",
    "USAGE",
    "USAGE_REPORTED",
    "ActivationFacts",
    "ActivationNode",
    "ActivationTrace",
    "ActorTree",
    "AdmissionGate",
    "AgentHandle",
    "AgentRegistry",
    "ApprovalAnswer",
    "ApprovalDesk",
    "ApprovalPolicy",
    "ApprovalPort",
    "ApprovalRequest",
    "ApprovalState",
    "ApprovalTranscript",
    "Budget",
    "BudgetPort",
    "CancelSignal",
    "ChildMeta",
    "ChildView",
    "ClaimConflict",
    "ContentBlock",
    "ContinuableStart",
    "ContinuableStartSpec",
    "Descriptor",
    "ErrorCode",
    "EventKind",
    "FencedCall",
    "ForwardedNode",
    "IdleThreads",
    "JsonValue",
    "LazyEvent",
    "LoadedSession",
    "MessageSource",
    "ModelCallTrace",
    "ModelSelector",
    "NewEvent",
    "Origin",
    "ParkedTask",
    "Price",
    "Prices",
    "ProviderRegistry",
    "Requester",
    "ResumeRequest",
    "RunTrace",
    "RuntimeInfo",
    "SendResult",
    "SessionEvent",
    "SpendGate",
    "Spent",
    "StartRequest",
    "StopReason",
    "SubagentControlError",
    "SubagentProvider",
    "SubagentResult",
    "SubagentRun",
    "SupervisorNode",
    "SupervisorState",
    "Suspended",
    "TaskNotice",
    "TaskOutcome",
    "TaskService",
    "TaskSnapshot",
    "TaskStatus",
    "Telemetry",
    "TextBlock",
    "TranscriptWriter",
    "TurnGate",
    "Usage",
    "UsageCounts",
    "budget_of",
    "count_problem",
    "dumps",
    "escape_controls",
    "fold_descriptor",
    "limit_text",
    "loaded_on_first_use",
    "plain_json",
    "read_usage",
    "requester_session",
    "seconds_problem",
    "spent_in",
    "storable_text",
    "text_of",
    "usage_counts",
    "usage_data",
    "usage_of",
    "utcnow",
]

# Each name is imported from its module on first use, so a caller that needs only the
# errors (the command line's usage path, the store's error mapping) does not build every
# pydantic model here: the models cost more than the rest of a `--help` together.
_HOMES: dict[str, str] = {
    **dict.fromkeys(["AgentHandle", "AgentRegistry"], "_agents"),
    **dict.fromkeys(
        [
            "ApprovalAnswer",
            "ApprovalDesk",
            "ApprovalPolicy",
            "ApprovalRequest",
            "ApprovalState",
            "ApprovalTranscript",
        ],
        "_approval",
    ),
    **dict.fromkeys(
        [
            "BUDGET_EXHAUSTED_STATUS",
            "Budget",
            "BudgetPort",
            "FencedCall",
            "LIMITS",
            "MODEL_CALL",
            "SpendGate",
            "Spent",
            "TOOL_CALL",
            "TOOL_ROUND",
            "TurnGate",
            "budget_of",
            "limit_text",
            "spent_in",
        ],
        "_budget",
    ),
    **dict.fromkeys(
        ["ContentBlock", "MessageSource", "ModelSelector", "TextBlock", "text_of"], "_content"
    ),
    **dict.fromkeys(["Descriptor", "fold_descriptor"], "_descriptor"),
    **dict.fromkeys(
        ["ClaimConflict", "ErrorCode", "ParkedTask", "SubagentControlError"], "_errors"
    ),
    **dict.fromkeys(
        ["JsonValue", "count_problem", "dumps", "plain_json", "seconds_problem", "storable_text"],
        "_json",
    ),
    **dict.fromkeys(["Price", "Prices"], "_price"),
    **dict.fromkeys(
        [
            "ProviderRegistry",
            "ResumeRequest",
            "StartRequest",
            "StopReason",
            "SubagentProvider",
            "SubagentResult",
            "SubagentRun",
            "TranscriptWriter",
        ],
        "_provider",
    ),
    **dict.fromkeys(["ModelCallTrace", "NO_RUN_TRACE", "RunTrace", "Suspended"], "_run_trace"),
    **dict.fromkeys(
        [
            "ActivationFacts",
            "ActivationTrace",
            "AdmissionGate",
            "ApprovalPort",
            "NO_TRACE",
            "Origin",
            "Requester",
            "TaskService",
            "Telemetry",
            "requester_session",
        ],
        "_services",
    ),
    **dict.fromkeys(
        ["ChildMeta", "EventKind", "LoadedSession", "NewEvent", "SessionEvent", "utcnow"],
        "_session",
    ),
    "IdleThreads": "_idle_threads",
    **dict.fromkeys(["CancelSignal", "LazyEvent"], "_signal"),
    **dict.fromkeys(
        ["ChildView", "ContinuableStart", "ContinuableStartSpec", "SendResult"], "_spec"
    ),
    **dict.fromkeys(
        ["RuntimeInfo", "TaskNotice", "TaskOutcome", "TaskSnapshot", "TaskStatus"], "_task_types"
    ),
    **dict.fromkeys(
        [
            "ActivationNode",
            "ActorTree",
            "ForwardedNode",
            "SupervisorNode",
            "SupervisorState",
        ],
        "_tree",
    ),
    "escape_controls": "_text",
    **dict.fromkeys(
        [
            "USAGE",
            "USAGE_REPORTED",
            "Usage",
            "UsageCounts",
            "read_usage",
            "usage_counts",
            "usage_data",
            "usage_of",
        ],
        "_usage",
    ),
}


__getattr__, __dir__ = loaded_on_first_use(__name__, _HOMES, __all__)
