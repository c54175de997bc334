"""subagent-control: the control plane for continuable background subagents.

Start with `SubagentControl` (the facade). These names are the public face; the rest is
reachable from named sub-modules: `controlplane.contract` (every type, error and
Protocol), `controlplane.models` (model adapters), `controlplane.tools` (tool-call
handlers), `controlplane.aio` (asyncio), `controlplane.telemetry`, `controlplane.cli`.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.contract import (
        ActorTree,
        AgentHandle,
        ApprovalAnswer,
        ApprovalRequest,
        Budget,
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
        Price,
        ResumeRequest,
        SendResult,
        SessionEvent,
        StartRequest,
        StopReason,
        SubagentControlError,
        SubagentProvider,
        SubagentResult,
        SubagentRun,
        TaskOutcome,
        TaskSnapshot,
        TaskStatus,
        TextBlock,
        Usage,
    )
    from controlplane.providers import (
        AcpProvider,
        ChildTool,
        ForkProvider,
        InProcessProvider,
        ScriptedModel,
    )
    from controlplane.runtime._facade import SubagentControl
    from controlplane.runtime._handle import ChildHandle
    from controlplane.runtime._task_view import Tasks

__all__ = [
    "AcpProvider",
    "ActorTree",
    "AgentHandle",
    "ApprovalAnswer",
    "ApprovalRequest",
    "Budget",
    "CancelSignal",
    "ChildHandle",
    "ChildMeta",
    "ChildTool",
    "ContinuableStart",
    "ContinuableStartSpec",
    "Descriptor",
    "ErrorCode",
    "EventKind",
    "ForkProvider",
    "InProcessProvider",
    "LoadedSession",
    "MessageSource",
    "ModelSelector",
    "NewEvent",
    "Price",
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
    "TaskOutcome",
    "TaskSnapshot",
    "TaskStatus",
    "Tasks",
    "TextBlock",
    "Usage",
]

# The contract's names here, each from its home in `controlplane.contract`.
_CONTRACT_NAMES = (
    "ActorTree",
    "AgentHandle",
    "ApprovalAnswer",
    "ApprovalRequest",
    "Budget",
    "CancelSignal",
    "ChildMeta",
    "ContinuableStart",
    "ContinuableStartSpec",
    "Descriptor",
    "ErrorCode",
    "EventKind",
    "LoadedSession",
    "MessageSource",
    "ModelSelector",
    "NewEvent",
    "Price",
    "ResumeRequest",
    "SendResult",
    "SessionEvent",
    "StartRequest",
    "StopReason",
    "SubagentControlError",
    "SubagentProvider",
    "SubagentResult",
    "SubagentRun",
    "TaskOutcome",
    "TaskSnapshot",
    "TaskStatus",
    "TextBlock",
    "Usage",
)

# Every public name is loaded on first use. The contract is a sub-package, so `import
# persistence` and `import actors` (which import it) run this file first, and so does every
# command line call (`controlplane.cli`): it must stay cheap, import no pydantic model, and
# must not import the facade (which imports them back) or the providers.
_LAZY: dict[str, str] = {
    **dict.fromkeys(_CONTRACT_NAMES, "controlplane.contract"),
    "AcpProvider": "controlplane.providers",
    "ChildHandle": "controlplane.runtime._handle",
    "ChildTool": "controlplane.providers",
    "ForkProvider": "controlplane.providers",
    "InProcessProvider": "controlplane.providers",
    "ScriptedModel": "controlplane.providers",
    "SubagentControl": "controlplane.runtime._facade",
    "Tasks": "controlplane.runtime._task_view",
}

# Importable from here until the next release, with a DeprecationWarning naming the home.
_DEPRECATED: dict[str, str] = {
    "ActivationNode": "controlplane.contract",
    "AgentRegistry": "controlplane.contract",
    "ChildView": "controlplane.contract",
    "ContentBlock": "controlplane.contract",
    "ProviderRegistry": "controlplane.contract",
    "SupervisorNode": "controlplane.contract",
    "TaskNotice": "controlplane.contract",
    "TaskService": "controlplane.contract",
    "TranscriptWriter": "controlplane.contract",
    "ChatMessage": "controlplane.models",
    "ModelAdapter": "controlplane.models",
    "ModelReply": "controlplane.models",
    "ModelRequest": "controlplane.models",
    "ToolCall": "controlplane.models",
    "ToolDefinition": "controlplane.models",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value  # once loaded, an ordinary attribute
        return value
    home = _DEPRECATED.get(name)
    if home is not None:
        # Never cached in globals(): every use warns, not only the first.
        warnings.warn(
            f"importing {name} from controlplane is deprecated and will stop working in the "
            f"next release; import it from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'controlplane' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# A library logs; the application decides where it goes (as pykka does for its own).
logging.getLogger(__name__).addHandler(logging.NullHandler())
