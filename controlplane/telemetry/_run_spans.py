"""The spans of a run's own work, under its activation: the activation's context made
current on a run's thread, one ``gen_ai`` client span per model call, one
``execute_tool`` span per child tool call (OpenTelemetry GenAI semantic conventions).

Apart from `controlplane.telemetry._activation_trace` because these run on the provider's
threads, not the activation's, and their names are the conventions', not ours. A failed
span is not ended on the spot: `Failures` keeps it until the Task settles, so its
``error.type`` is the code that settled the Task (one ``error.type`` per failure, across
the whole trace), and it is ended with the time it failed.
"""

from __future__ import annotations

import threading
import time
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import ModelCallTrace, Suspended
from controlplane.telemetry._otel import (
    ERROR_TYPE,
    GENAI_PROVIDER,
    OPERATION,
    REQUEST_MODEL,
    clip,
    error_type,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from controlplane.telemetry._otel import (
        Api,
    )

__all__ = [
    "INPUT_TOKENS",
    "OUTPUT_TOKENS",
    "TOOL_NAME",
    "Current",
    "Failures",
    "ModelSpan",
    "ToolSpan",
]

INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
PARKED: Final = "subagent.parked"


class Failures:
    """Spans that failed under one activation, ended when it settles (`settle`)."""

    __slots__ = ("_lock", "_settled", "_spans")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[Span, str, int]] = []
        self._settled: str | None = None

    def failed(self, span: Span, exc: BaseException) -> None:
        """``span`` failed with ``exc``: ended now if the Task settled, else at `settle`."""
        now = time.time_ns()
        with self._lock:
            settled = self._settled
            if settled is None:
                self._spans.append((span, error_type(exc), now))
                return
        span.set_attribute(ERROR_TYPE, settled)
        span.end(end_time=now)

    def first(self) -> str | None:
        """The ``error.type`` of the first failure, if any (for a settlement without code)."""
        with self._lock:
            return self._spans[0][1] if self._spans else None

    def settle(self, code: str | None) -> None:
        """The Task settled with ``code`` (None: no code; each span keeps its own)."""
        with self._lock:
            spans, self._spans = self._spans, []
            self._settled = code or "_OTHER"
        for span, own, ended in spans:
            span.set_attribute(ERROR_TYPE, code or own)
            span.end(end_time=ended)


class Current:
    """The activation's span current on this thread meanwhile."""

    __slots__ = ("_api", "_span", "_token")

    def __init__(self, api: Api, span: Span) -> None:
        self._api = api
        self._span = span
        self._token: Token[Any] | None = None

    def __enter__(self) -> None:
        self._token = self._api.attach(self._api.set_span_in_context(self._span))

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._api.detach(self._token)


class _Child:
    """A child span of the thread's current span (else of the activation), current on
    this thread while it lasts; a raise is handed to `Failures`."""

    __slots__ = ("_api", "_attributes", "_failures", "_kind", "_name", "_parent", "_span",
                 "_token", "_tracer")  # fmt: skip

    def __init__(
        self,
        api: Api,
        tracer: Tracer,
        parent: Span,
        failures: Failures,
        name: str,
        attributes: dict[str, str],
        kind: Any,
    ) -> None:
        self._api, self._tracer, self._parent = api, tracer, parent
        self._failures = failures
        self._name, self._attributes, self._kind = name, attributes, kind
        self._span: Span | None = None
        self._token: Token[Any] | None = None

    def _open(self) -> None:
        api = self._api
        context = api.get_current()
        current = api.get_current_span(context).get_span_context()
        if current.trace_id != self._parent.get_span_context().trace_id:
            # A thread the run did not make current (a provider that never called
            # `current`): the activation is the parent all the same.
            context = api.set_span_in_context(self._parent)
        span = self._span = self._tracer.start_span(
            self._name, context=context, kind=self._kind, attributes=self._attributes
        )
        self._token = api.attach(api.set_span_in_context(span, context))

    def _close(self, exc: BaseException | None) -> None:
        span = self._span
        if span is None:
            return
        if self._token is not None:
            self._api.detach(self._token)
        if exc is None or isinstance(exc, Suspended):
            if exc is not None:  # parked on an approval request: not a failure
                span.set_attribute(PARKED, True)
            span.end()
            return
        span.set_status(self._api.error, clip(str(exc)))
        self._failures.failed(span, exc)


class ModelSpan(_Child, ModelCallTrace):
    """One model call: ``chat {model}``, a client span."""

    __slots__ = ()

    def __init__(
        self,
        api: Api,
        tracer: Tracer,
        parent: Span,
        failures: Failures,
        model: str | None,
        provider: str | None,
    ) -> None:
        attributes = {OPERATION: "chat"}
        if model:
            attributes[REQUEST_MODEL] = model
        if provider:
            attributes[GENAI_PROVIDER] = provider
        name = f"chat {model}" if model else "chat"
        super().__init__(api, tracer, parent, failures, name, attributes, api.client)

    def __enter__(self) -> ModelSpan:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(exc)

    def usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        span = self._span
        if span is None:
            return
        usage = {}
        if input_tokens is not None:
            usage[INPUT_TOKENS] = input_tokens
        if output_tokens is not None:
            usage[OUTPUT_TOKENS] = output_tokens
        span.set_attributes(usage)


class ToolSpan(_Child):
    """One child tool call: ``execute_tool {name}``, approval included."""

    __slots__ = ()

    def __init__(
        self, api: Api, tracer: Tracer, parent: Span, failures: Failures, name: str
    ) -> None:
        attributes = {OPERATION: "execute_tool", TOOL_NAME: name}
        super().__init__(
            api, tracer, parent, failures, f"execute_tool {name}", attributes, api.internal
        )

    def __enter__(self) -> None:
        self._open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(exc)
