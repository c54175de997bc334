"""The providers: what runs a child's turn, and the model adapters they call.

- `InProcessProvider` and `ForkProvider`: a model-and-tools loop on a thread of this
  process (`_agent_loop`), over any `ModelAdapter` (`_model`: the adapter Protocol and its
  request and reply types; `_chat_history`: a transcript replayed as chat messages;
  `_recovery`: the tool calls a crash left open, answered when the child resumes);
- `ChildTool`: the tools such a child may call (`_child_tools`);
- `ScriptedModel`: a deterministic adapter for demos and tests;
- `OpenAIChatModel`: an adapter over the Chat Completions API (`_openai_model`, its wire
  format in `_openai_wire`); public as `controlplane.models.OpenAIChatModel`;
- `AcpProvider`: a child that is an agent subprocess speaking the Agent Client Protocol
  (`_acp`, `_acp_client`, `_acp_guard`).

Providers implement the contract's `SubagentProvider` and import only the contract: never
the runtime, the actors or the store. Optional extras (``openai``, ``acp``) are imported
when a class that needs them is used (`_extras`).
"""

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
from controlplane.providers._openai_model import OpenAIChatModel
from controlplane.providers._scripted import ScriptedModel

__all__ = [
    "AcpProvider",
    "ChatMessage",
    "ChildTool",
    "ForkProvider",
    "InProcessProvider",
    "ModelAdapter",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "ScriptedModel",
    "ToolCall",
    "ToolDefinition",
]
