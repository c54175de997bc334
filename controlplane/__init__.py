"""subagent-control: the control plane for continuable background subagents.

Start with `SubagentControl` (the facade). The contract (types, errors, protocols) is
importable on its own: `persistence` and `actors` import it without pulling in the facade,
which is loaded on first use of `SubagentControl`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from controlplane.contract import (
    ActivationNode,
    ActorTree,
    AgentHandle,
    AgentRegistry,
    CancelSignal,
    ChildMeta,
    ContinuableStart,
    ContinuableStartSpec,
    Descriptor,
    ErrorCode,
    EventKind,
    LoadedSession,
    MessageSource,
    ModelSelector,
    NewEvent,
    ProviderRegistry,
    ResumeRequest,
    SendResult,
    SessionEvent,
    StartRequest,
    StopReason,
    SubagentControlError,
    SubagentProvider,
    SubagentResult,
    SubagentRun,
    SupervisorNode,
    TaskNotice,
    TaskOutcome,
    TaskService,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
    TranscriptWriter,
)
from controlplane.contract._content import ContentBlock

if TYPE_CHECKING:
    from controlplane._facade import ChildView, SubagentControl
    from controlplane.providers._acp import AcpProvider
    from controlplane.providers._child_tools import ChildTool
    from controlplane.providers._fork import ForkProvider
    from controlplane.providers._inprocess import InProcessProvider
    from controlplane.providers._model import (
        ChatMessage,
        ModelAdapter,
        ModelReply,
        ModelRequest,
        ToolCall,
        ToolDefinition,
    )
    from controlplane.providers._scripted import ScriptedModel

__all__ = [
    "AcpProvider",
    "ActivationNode",
    "ActorTree",
    "AgentHandle",
    "AgentRegistry",
    "CancelSignal",
    "ChatMessage",
    "ChildMeta",
    "ChildTool",
    "ChildView",
    "ContentBlock",
    "ContinuableStart",
    "ContinuableStartSpec",
    "Descriptor",
    "ErrorCode",
    "EventKind",
    "ForkProvider",
    "InProcessProvider",
    "LoadedSession",
    "MessageSource",
    "ModelAdapter",
    "ModelReply",
    "ModelRequest",
    "ModelSelector",
    "NewEvent",
    "ProviderRegistry",
    "ResumeRequest",
    "ScriptedModel",
    "SendResult",
    "SessionEvent",
    "StartRequest",
    "StopReason",
    "SubagentControl",
    "SubagentControlError",
    "SubagentProvider",
    "SubagentResult",
    "SubagentRun",
    "SupervisorNode",
    "TaskNotice",
    "TaskOutcome",
    "TaskService",
    "TaskSnapshot",
    "TaskStatus",
    "TextBlock",
    "ToolCall",
    "ToolDefinition",
    "TranscriptWriter",
]

_LAZY = {
    "AcpProvider": "controlplane.providers._acp",
    "ChildTool": "controlplane.providers._child_tools",
    "ChatMessage": "controlplane.providers._model",
    "ForkProvider": "controlplane.providers._fork",
    "InProcessProvider": "controlplane.providers._inprocess",
    "ModelAdapter": "controlplane.providers._model",
    "ModelReply": "controlplane.providers._model",
    "ModelRequest": "controlplane.providers._model",
    "ScriptedModel": "controlplane.providers._scripted",
    "ToolCall": "controlplane.providers._model",
    "ToolDefinition": "controlplane.providers._model",
    "ChildView": "controlplane._facade",
    "SubagentControl": "controlplane._facade",
}


def __getattr__(name: str) -> Any:
    # The facade wires actors and persistence, which import this package's contract:
    # loading it lazily keeps `import persistence` / `import actors` free of cycles.
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'controlplane' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# A library logs; the application decides where it goes (as pykka does for its own).
logging.getLogger(__name__).addHandler(logging.NullHandler())
