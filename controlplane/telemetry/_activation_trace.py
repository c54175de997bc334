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
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import ActivationTrace
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
    Api,
    clip,
    error_type,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from controlplane.contract import Descriptor, Origin, TaskOutcome, TextBlock
    from controlplane.telemetry._telemetry import Telemetry

__all__ = ["SpanTrace"]


class SpanTrace(ActivationTrace):
    """One activation's span and timings, from admission to settlement (the contract's
    `ActivationTrace`). Thread-safe: the supervisor adds steer events while the
    activation's thread runs its phases."""

    __slots__ = ("_api", "_ended", "_lock", "_model", "_span", "_started", "_telemetry",
                 "_tracer", "child_id", "origin", "route", "task_id")  # fmt: skip

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

    def phase(self, name: str, *, current: bool = False) -> _Phase | _NoPhase:
        """A child span around one phase (`PHASES`); ``current`` makes it the thread's
        current span meanwhile, so what the provider instruments nests under it."""
        if self._span is None or self._api is None or self._tracer is None:
            return _NO_PHASE
        return _Phase(self._api, self._tracer, self._span, name, current)

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

    def steered(self, message: Sequence[TextBlock], source_kind: str) -> None:
        """A message was handed to the running turn (an event on the activation's span,
        with the message's length: measured only when there is a span)."""
        if self._span is not None:
            chars = sum(len(block.text) for block in message)
            self._span.add_event("subagent.steered", {CHARS: chars, SOURCE: source_kind})

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
        if outcome is None:
            span.set_status(api.error, "the activation was never admitted")
        else:
            attributes = {OUTCOME: status or ""}
            if outcome.detail:
                attributes[DETAIL] = clip(outcome.detail)
            if outcome.code is not None:
                attributes[ERROR_TYPE] = outcome.code.value
            span.set_attributes(attributes)
            if status in ("failed", "interrupted"):
                span.set_status(api.error, clip(outcome.detail or status))
        span.end()


class _Phase:
    """A phase's child span of a recorded activation span."""

    __slots__ = ("_api", "_current", "_name", "_parent", "_span", "_token", "_tracer")

    def __init__(self, api: Api, tracer: Tracer, parent: Span, name: str, current: bool) -> None:
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
        if exc is not None:
            span.set_attribute(ERROR_TYPE, error_type(exc))
            span.set_status(self._api.error, clip(str(exc)))
        span.end()


class _NoPhase:
    """The phase of an activation whose span is not recorded: nothing at all."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_PHASE: Final = _NoPhase()
