"""The public modules: their export lists are decisions, frozen here; names that moved keep
working from their old import path for one release, with a warning naming the new one."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import controlplane
import controlplane.aio
import controlplane.contract
import controlplane.models
import controlplane.tools

EXPORTS = [
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

SPEC_NAMES = {
    "SubagentControl",
    "TextBlock",
    "MessageSource",
    "ModelSelector",
    "Descriptor",
    "ContinuableStartSpec",
    "ContinuableStart",
    "SendResult",
    "TaskSnapshot",
    "TaskOutcome",
    "TaskStatus",
    "SubagentResult",
    "StopReason",
    "StartRequest",
    "ResumeRequest",
    "LoadedSession",
    "ChildMeta",
    "SessionEvent",
    "ActorTree",
    "SubagentProvider",
    "SubagentRun",
    "SubagentControlError",
    "ErrorCode",
    "CancelSignal",
    "ChildTool",
    "AcpProvider",
}

# Importable from `controlplane` until the next release; the value is the new home.
MOVED = {
    "ActivationNode": controlplane.contract,
    "AgentRegistry": controlplane.contract,
    "ChildView": controlplane.contract,
    "ContentBlock": controlplane.contract,
    "ProviderRegistry": controlplane.contract,
    "SupervisorNode": controlplane.contract,
    "TaskNotice": controlplane.contract,
    "TaskService": controlplane.contract,
    "TranscriptWriter": controlplane.contract,
    "ChatMessage": controlplane.models,
    "ModelAdapter": controlplane.models,
    "ModelReply": controlplane.models,
    "ModelRequest": controlplane.models,
    "ToolCall": controlplane.models,
    "ToolDefinition": controlplane.models,
}


def test_the_package_exports_exactly_its_public_names() -> None:
    assert controlplane.__all__ == EXPORTS
    assert set(controlplane.__all__) >= SPEC_NAMES
    for name in controlplane.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a public name never warns
            assert getattr(controlplane, name) is not None, name


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_still_resolves_to_the_same_object_and_warns_with_its_new_home(
    name: str,
) -> None:
    home = MOVED[name]

    with pytest.warns(DeprecationWarning, match=rf"import it from {home.__name__}$"):
        value = getattr(controlplane, name)

    assert value is getattr(home, name)
    assert name in home.__all__
    assert name not in controlplane.__all__


def test_a_moved_name_warns_on_every_import_not_only_the_first() -> None:
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="TaskNotice"):
            from controlplane import TaskNotice  # noqa: F401


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        controlplane.Nope  # noqa: B018


def test_the_models_module_exports_the_model_adapter_types() -> None:
    assert controlplane.models.__all__ == [
        "ChatMessage",
        "ModelAdapter",
        "ModelReply",
        "ModelRequest",
        "OpenAIChatModel",
        "ToolCall",
        "ToolDefinition",
    ]


def test_the_tools_module_exports_exactly_its_public_names() -> None:
    assert controlplane.tools.__all__ == [
        "INTERNAL_ERROR",
        "MAX_MESSAGE_CHARS",
        "HumanInput",
        "ToolHandlers",
        "ToolResult",
    ]
    for name in controlplane.tools.__all__:
        assert getattr(controlplane.tools, name) is not None


def test_the_aio_module_exports_exactly_its_public_names() -> None:
    assert controlplane.aio.__all__ == ["AsyncSubagentControl"]


def test_importing_the_tools_does_not_load_the_facade_or_the_actors() -> None:
    code = (
        "import sys, controlplane.tools, controlplane.aio; "
        "print(sorted(m for m in ('controlplane.runtime._facade', 'actors', 'persistence') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
