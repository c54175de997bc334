"""Model adapters: the `ModelAdapter` Protocol an `InProcessProvider` calls, its request
and reply types, and `OpenAIChatModel`, an adapter over the Chat Completions API.

The public home of these names; they are implemented in `controlplane.providers`. The
``openai`` package is an optional extra, imported when `OpenAIChatModel` is built:
``pip install 'subagent-control[openai]'``.
"""

from controlplane.providers import (
    ChatMessage,
    ModelAdapter,
    ModelReply,
    ModelRequest,
    OpenAIChatModel,
    ToolCall,
    ToolDefinition,
)

__all__ = [
    "ChatMessage",
    "ModelAdapter",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "ToolCall",
    "ToolDefinition",
]
