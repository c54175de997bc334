"""One activation's trace, from admission to settlement: its span, the child spans of its
phases, the events the supervisor adds while it runs, and its metrics when it settles.

It lives apart from `controlplane.telemetry._telemetry` because it is the part that crosses threads:
the caller's `Origin` is handed with the admission, the supervisor adds steer events while
the activation's own thread runs its phases, and either may settle it. `Telemetry` admits
it (`Telemetry.activation`) and it reads that `Telemetry`'s metrics only as it emits, so
the import runs one way, `_telemetry` to here (the back-reference is a type only).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import NO_RUN_TRACE, ActivationTrace
from controlplane.telemetry._lifecycle import log_lifecycle
from controlplane.telemetry._otel import (
    CHARS,
    DETAIL,
    ERROR_TYPE,
    GENAI_PROVIDER,
    GENAI_SYSTEM,
    OPERATION,
    OUTCOME,
    PHASES,
    PROVIDER,
    REQUEST_MODEL,
    ROUTE,
    SOURCE,
    TOKEN_TYPE,
    clip,
)
from controlplane.telemetry._run_spans import Current, Failures, ModelSpan, ToolSpan

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from controlplane.contract import Descriptor, ModelCallTrace, Origin, TaskOutcome, TextBlock
    from controlplane.telemetry._otel import (
        Api,
    )
    from controlplane.telemetry._telemetry import Telemetry

__all__ = ["SpanTrace"]

SENT_TRACE: Final = "subagent.send.trace_id"
SENT_SPAN: Final = "subagent.send.span_id"
KILL_TRACE: Final = "subagent.kill.trace_id"
KILL_SPAN: Final = "subagent.kill.span_id"


class SpanTrace(ActivationTrace):
    """One activation's span and timings, from admission to settlement (the contract's
    `ActivationTrace`). Thread-safe: the supervisor adds steer events while the
    activation's thread runs its phases."""

    __slots__ = ("_api", "_ended", "_failures", "_lock", "_model", "_span", "_started",
                 "_telemetry", "_tracer", "child_id", "origin", "route", "task_id")  # fmt: skip

    def __init__(
        self,
        telemetry: Telemetry,
        task_id: str,
        child_id: str,
        route: str,
        origin: Origin | None,
        span: Span | None,
    ) -> None:
        self._telemetry = telemetry
        self.task_id = task_id
        self.child_id = child_id
        self.route = route
        self.origin = origin
        self._span = span if span is not None and span.is_recording() else None
        # Kept from admission: the phases and the end go where the activation began.
        self._api, self._tracer = telemetry._api, telemetry._tracer
        self._started = time.perf_counter()
        self._lock = threading.Lock()
        self._ended = False
        # The token metric's attributes: the operation, and the model once described.
        self._model: dict[str, str] = {OPERATION: "chat"}
        self._failures = Failures()

    def phase(self, name: str, *, current: bool = False) -> _Phase | _NoPhase:
        """A child span around one phase (`PHASES`); ``current`` makes it the thread's
        current span meanwhile, so what the provider instruments nests under it."""
        if self._span is None or self._api is None or self._tracer is None:
            return _NO_PHASE
        return _Phase(self._api, self._tracer, self._span, name, current, self._failures)

    def loading(self) -> _Phase | _NoPhase:
        """The ``subagent.load`` phase: a resume reads the child from the store."""
        return self.phase(PHASES[0])

    def calling_provider(self, *, resumed: bool) -> _Phase | _NoPhase:
        """The ``subagent.provider.start``/``.resume`` phase (current on this thread, so a
        provider's own spans nest under it); a resume's latency ends as it begins."""
        if resumed:
            self.provider_called()
        return self.phase(PHASES[2] if resumed else PHASES[1], current=True)

    def publishing(self) -> _Phase | _NoPhase:
        """The ``subagent.publish`` phase: the frame (and a new child's header) written."""
        return self.phase(PHASES[3])

    def disposing(self) -> _Phase | _NoPhase:
        """The ``subagent.dispose`` phase: the run released."""
        return self.phase(PHASES[4])

    def describe(self, descriptor: Descriptor) -> None:
        """Name the provider and model once the descriptor is known (a resume folds it)."""
        model = {OPERATION: "chat"}
        if descriptor.agent_model:
            model[REQUEST_MODEL] = descriptor.agent_model
        if descriptor.agent_provider:
            model[GENAI_PROVIDER] = model[GENAI_SYSTEM] = descriptor.agent_provider
        self._model = model
        span = self._span
        if span is None:
            return
        attributes = {PROVIDER: descriptor.provider}
        if descriptor.agent_model:
            attributes[REQUEST_MODEL] = descriptor.agent_model
        if descriptor.agent_provider:
            attributes[GENAI_PROVIDER] = descriptor.agent_provider
        span.set_attributes(attributes)

    def model_call(self, input_tokens: int, output_tokens: int) -> None:
        """A model call's reported tokens: one ``gen_ai.client.token.usage`` value per
        token type (``input``, ``output``), as the GenAI semantic conventions record it."""
        metrics = self._telemetry._metrics
        if metrics is None:
            return
        model = self._model
        metrics.tokens.record(input_tokens, {**model, TOKEN_TYPE: "input"})
        metrics.tokens.record(output_tokens, {**model, TOKEN_TYPE: "output"})

    def provider_called(self) -> None:
        """``provider.resume`` is being called: the resume latency ends here."""
        metrics = self._telemetry._metrics
        if metrics is not None and self.route == "resumed" and self.origin is not None:
            metrics.resume_s.record(time.perf_counter() - self.origin.started)

    def published(self) -> None:
        """The run is published: the child is durable and takes steers."""
        log_lifecycle(
            logging.INFO, "publish", child_id=self.child_id, task_id=self.task_id,
            runtime_id=self._telemetry.runtime_id, route=self.route,
        )  # fmt: skip
        if self._span is not None:
            self._span.add_event("subagent.published")

    def steered(
        self, message: Sequence[TextBlock], source_kind: str, sender: object = None
    ) -> None:
        """A message was handed to the running turn: an event on the activation's span
        naming the send that steered it (its span's ids, and the message's length), and a
        link from that send's span to the activation."""
        span = self._span
        if span is None:
            return
        chars = sum(len(block.text) for block in message)
        attributes: dict[str, str | int] = {CHARS: chars, SOURCE: source_kind}
        if sender is not None:
            sent = sender.get_span_context()  # type: ignore[attr-defined]
            if sent.is_valid:
                attributes[SENT_TRACE] = format(sent.trace_id, "032x")
                attributes[SENT_SPAN] = format(sent.span_id, "016x")
                if sender.is_recording():  # type: ignore[attr-defined]
                    link = {"subagent.link": "activation"}
                    sender.add_link(span.get_span_context(), link)  # type: ignore[attr-defined]
        span.add_event("subagent.steered", attributes)

    def killed(self) -> None:
        """A kill aborted this activation, on the kill's thread: a link from the kill's
        span (current there, a lone trace when the caller had none) to the activation,
        and an event on the activation naming it."""
        span, api = self._span, self._api
        if span is None or api is None:
            return
        killer = api.get_current_span()
        attributes: dict[str, str | int] = {}
        killed_by = killer.get_span_context()
        if killed_by.is_valid:
            attributes[KILL_TRACE] = format(killed_by.trace_id, "032x")
            attributes[KILL_SPAN] = format(killed_by.span_id, "016x")
            if killer.is_recording():
                killer.add_link(span.get_span_context(), {"subagent.link": "activation"})
        span.add_event("subagent.killed", attributes)

    def sender(self) -> object:
        """The calling thread's current span (the send's), when this activation is traced."""
        if self._span is None or self._api is None:
            return None
        return self._api.get_current_span()

    # -- the run's own threads (`RunTrace`) ---------------------------------------------

    def current(self) -> AbstractContextManager[None]:
        """The activation's span current on this thread meanwhile."""
        if self._span is None or self._api is None:
            return NO_RUN_TRACE.current()
        return Current(self._api, self._span)

    def calling_model(self, model: str | None) -> ModelCallTrace:
        """A ``chat {model}`` client span around one model call."""
        if self._span is None or self._api is None or self._tracer is None:
            return NO_RUN_TRACE.calling_model(model)
        provider = self._model.get(GENAI_PROVIDER)
        return ModelSpan(self._api, self._tracer, self._span, self._failures, model, provider)

    def calling_tool(self, name: str) -> AbstractContextManager[None]:
        """An ``execute_tool {name}`` span around one child tool call."""
        if self._span is None or self._api is None or self._tracer is None:
            return NO_RUN_TRACE.calling_tool(name)
        return ToolSpan(self._api, self._tracer, self._span, self._failures, name)

    def end(self, outcome: TaskOutcome | None) -> None:
        """The Task settled with ``outcome`` (None: it was never admitted after all, and
        is not counted). Only the first call counts."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        metrics = self._telemetry._metrics
        status = outcome.status.value if outcome is not None else None
        if metrics is not None:
            metrics.live.add(-1, {ROUTE: self.route})
            if status is not None:
                attributes = {ROUTE: self.route, OUTCOME: status}
                metrics.activations.add(1, attributes)
                metrics.activation_s.record(time.perf_counter() - self._started, attributes)
        span, api = self._span, self._api
        if span is None or api is None:
            return
        # One error.type across the trace: the code that settled the Task, on the
        # activation and on every span that failed under it.
        code = outcome.code.value if outcome is not None and outcome.code is not None else None
        first = self._failures.first()
        self._failures.settle(code)
        if outcome is None:
            span.set_status(api.error, "the activation was never admitted")
            if first is not None:
                span.set_attribute(ERROR_TYPE, first)
        else:
            attributes = {OUTCOME: status or ""}
            if outcome.detail:
                attributes[DETAIL] = clip(outcome.detail)
            if code is not None or (first is not None and status in ("failed", "interrupted")):
                attributes[ERROR_TYPE] = code or first or ""
            span.set_attributes(attributes)
            if status in ("failed", "interrupted"):
                span.set_status(api.error, clip(outcome.detail or status))
        span.end()


class _Phase:
    """A phase's child span of a recorded activation span."""

    __slots__ = ("_api", "_current", "_failures", "_name", "_parent", "_span", "_token",
                 "_tracer")  # fmt: skip

    def __init__(
        self, api: Api, tracer: Tracer, parent: Span, name: str, current: bool, failures: Failures
    ) -> None:
        self._failures = failures
        self._api = api
        self._tracer = tracer
        self._parent = parent
        self._name = name
        self._current = current
        self._span: Span | None = None
        self._token: Token[Any] | None = None

    def __enter__(self) -> None:
        api = self._api
        parent = api.set_span_in_context(self._parent)
        span = self._span = self._tracer.start_span(self._name, context=parent)
        if self._current:
            self._token = api.attach(api.set_span_in_context(span, parent))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        if self._token is not None:
            self._api.detach(self._token)
        if exc is None:
            span.end()
            return
        span.set_status(self._api.error, clip(str(exc)))
        self._failures.failed(span, exc)  # its error.type: the Task's, once it settles


class _NoPhase:
    """The phase of an activation whose span is not recorded: nothing at all."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_PHASE: Final = _NoPhase()
