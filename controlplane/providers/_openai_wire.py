"""What `OpenAIChatModel` sends and reads: Chat Completions payloads, replies and errors.

Kept apart from the adapter's threading so each half can be read on its own. Objects from the
SDK are read by attribute (``Any``): the adapter works with any ``openai`` version whose
Chat Completions types have these fields.
"""

from __future__ import annotations

import email.utils
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from controlplane.contract import ErrorCode, StopReason, SubagentControlError, Usage
from controlplane.providers._model import ModelReply, ModelRequest, ToolCall

__all__ = [
    "StreamedReply",
    "chat_payload",
    "failure_of",
    "is_retryable",
    "reply_of",
    "retry_after_s",
    "stop_reason_of",
    "usage_of",
]

log = logging.getLogger("controlplane.models")

_STOP_REASONS = {
    "stop": StopReason.COMPLETED.value,
    "tool_calls": StopReason.COMPLETED.value,
    "function_call": StopReason.COMPLETED.value,
    "length": StopReason.MAX_TOKENS.value,
    "content_filter": StopReason.REFUSAL.value,
}
_RETRYABLE_STATUS = frozenset({408, 409, 429})


def chat_payload(request: ModelRequest, default_model: str) -> dict[str, Any]:
    """The ``chat.completions.create`` arguments for ``request`` (``stream`` left out).

    The persona is the system message; a request's `ModelSelector` names the model, else
    ``default_model``.
    """
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        if message.role == "tool":
            messages.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
            )
        elif message.role == "assistant" and message.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": message.text or None,
                    "tool_calls": [_call_payload(call) for call in message.tool_calls],
                }
            )
        else:
            messages.append({"role": message.role, "content": message.text})
    payload: dict[str, Any] = {
        "model": request.model.model if request.model else default_model,
        "messages": messages,
    }
    if request.tools:
        payload["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or {"type": "object", "properties": {}},
                },
            }
            for tool in request.tools
        ]
    return payload


def stop_reason_of(finish_reason: str | None) -> str:
    """Our stop reason for a Chat Completions ``finish_reason`` (unknown ones pass through)."""
    if finish_reason is None:
        return StopReason.COMPLETED.value
    return _STOP_REASONS.get(finish_reason, finish_reason)


def reply_of(completion: Any) -> ModelReply:
    """The reply in a non-streamed ``ChatCompletion``."""
    if not completion.choices:
        raise SubagentControlError(ErrorCode.INTERNAL, "the model server answered no choice")
    choice = completion.choices[0]
    message = choice.message
    calls = [
        ToolCall(id=c.id or "", name=c.function.name or "", arguments=c.function.arguments or "")
        for c in (message.tool_calls or [])
    ]
    return ModelReply(
        text=message.content or "",
        stop_reason=stop_reason_of(choice.finish_reason),
        tool_calls=calls,
        usage=usage_of(getattr(completion, "usage", None)),
    )


def usage_of(reported: Any) -> Usage | None:
    """Our `Usage` for a Chat Completions ``usage`` object; None when there is none.

    ``prompt_tokens`` → ``input_tokens``, ``completion_tokens`` → ``output_tokens``,
    ``prompt_tokens_details.cached_tokens`` → ``cached_input_tokens``,
    ``completion_tokens_details.reasoning_tokens`` → ``reasoning_tokens``; a count the
    server leaves out is 0. A report that is not counts (negative, text) is logged and read
    as none: the reply itself is good, and a made-up number would be worse than no number.
    """
    if reported is None:
        return None
    prompt = getattr(reported, "prompt_tokens_details", None)
    completion = getattr(reported, "completion_tokens_details", None)
    counts = {
        "input_tokens": getattr(reported, "prompt_tokens", None),
        "output_tokens": getattr(reported, "completion_tokens", None),
        "cached_input_tokens": getattr(prompt, "cached_tokens", None),
        "reasoning_tokens": getattr(completion, "reasoning_tokens", None),
    }
    try:
        return Usage.model_validate({k: v for k, v in counts.items() if v is not None})
    except SubagentControlError as exc:
        log.warning("the model server reported a usage that is not counts (%s); ignored", exc)
        return None


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamedReply:
    """Collects ``ChatCompletionChunk`` deltas into one `ModelReply`.

    A tool call arrives split across chunks, keyed by its ``index``: the id and name
    usually first, the arguments in pieces.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._finish: str | None = None
        self._usage: Any = None

    def add(self, chunk: Any) -> None:
        """Take one chunk's first choice, and its usage (the last chunk's, asked for with
        ``stream_options.include_usage``; its ``choices`` are empty)."""
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self._usage = usage
        for choice in chunk.choices or ():
            if choice.index not in (0, None):
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._text.append(delta.content)
                for piece in delta.tool_calls or ():
                    partial = self._calls.setdefault(piece.index or 0, _PartialCall())
                    partial.id = partial.id or (piece.id or "")
                    function = piece.function
                    if function is not None:
                        partial.name += function.name or ""
                        if function.arguments:
                            partial.arguments.append(function.arguments)
            if choice.finish_reason:
                self._finish = choice.finish_reason

    def reply(self) -> ModelReply:
        """The reply the chunks so far add up to."""
        calls = [
            ToolCall(id=p.id, name=p.name, arguments="".join(p.arguments))
            for _, p in sorted(self._calls.items())
        ]
        return ModelReply(
            text="".join(self._text),
            stop_reason=stop_reason_of(self._finish),
            tool_calls=calls,
            usage=usage_of(self._usage),
        )


def is_retryable(exc: BaseException, openai: Any) -> bool:
    """Whether a failed call may succeed if tried again: a rate limit, a server error, a
    timeout or a dropped connection."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def retry_after_s(exc: BaseException | None) -> float | None:
    """The wait a server asked for (``retry-after-ms``, ``retry-after`` seconds or date)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if (millis := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(millis) / 1000.0)
        raw = headers.get("retry-after")
        if raw is None:
            return None
        try:
            return max(0.0, float(raw))
        except ValueError:
            when = email.utils.parsedate_to_datetime(raw)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def failure_of(exc: BaseException, openai: Any, base_url: str) -> SubagentControlError:
    """The error a failed call ends the child's turn with, in the server's own words."""
    if isinstance(exc, openai.APIStatusError):
        words = _server_words(exc)
        code = (
            ErrorCode.INVALID_INPUT
            if 400 <= exc.status_code < 500 and exc.status_code not in _RETRYABLE_STATUS
            else ErrorCode.INTERNAL
        )
        return SubagentControlError(
            code, f"the model server at {base_url} answered HTTP {exc.status_code}: {words}"
        )
    if isinstance(exc, openai.APITimeoutError):
        return SubagentControlError(
            ErrorCode.TIMEOUT, f"the model server at {base_url} did not answer in time"
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return SubagentControlError(
            ErrorCode.INTERNAL, f"could not reach the model server at {base_url}: {cause}"
        )
    return SubagentControlError(
        ErrorCode.INTERNAL,
        f"the model call to {base_url} failed: {type(exc).__name__}: {exc}",
    )


def _server_words(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(exc, "message", None) or exc)


def _call_payload(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
