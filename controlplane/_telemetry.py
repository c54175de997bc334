"""Observability: OpenTelemetry spans and metrics, and the lifecycle lines of the logs.

Depends only on ``opentelemetry-api``, and only when it is installed (the ``otel`` extra):
without it every hook here is a no-op costing an attribute test, and with it but no SDK
configured the API's own no-op tracer and meter answer (the spans are never recorded).
The API is imported when a control plane is built, never at ``import controlplane``.

Everything the actors and the facade emit goes through one `Telemetry` per control plane:

- ``subagent.start`` and ``subagent.send`` spans on the caller's thread, children of the
  caller's current span (the parent's tool call);
- one ``subagent.activation`` span per activation, from admission to settlement, a child of
  the start or send that admitted it, with child spans for its phases (`PHASES`);
- the metric instruments (`METRICS`);
- the lifecycle log lines it owns (`controlplane._lifecycle`): start, publish, steer,
  retry.

Names follow the OpenTelemetry GenAI semantic conventions where one fits
(``gen_ai.agent.id``, ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.provider.name``, ``error.type``); the rest are ``subagent.*``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from controlplane._errors import SubagentControlError
from controlplane._lifecycle import current_scope, lifecycle_enabled, log_lifecycle, scoped

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Counter, Histogram, MeterProvider, UpDownCounter
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

    from controlplane._content import MessageSource, TextBlock
    from controlplane._descriptor import Descriptor
    from controlplane._spec import ContinuableStart, SendResult
    from controlplane._task_types import TaskOutcome

__all__ = [
    "METRICS",
    "NO_TELEMETRY",
    "NO_TRACE",
    "PHASES",
    "ActivationTrace",
    "Operation",
    "Origin",
    "Telemetry",
]

INSTRUMENTATION: Final = "subagent-control"

SPAN_START: Final = "subagent.start"
SPAN_SEND: Final = "subagent.send"
SPAN_ACTIVATION: Final = "subagent.activation"
PHASES: Final = (
    "subagent.load",
    "subagent.provider.start",
    "subagent.provider.resume",
    "subagent.publish",
    "subagent.dispose",
)
"""The child spans of an activation."""

METRICS: Final = {
    "subagent.activations": ("{activation}", "activations settled, by route and outcome"),
    "subagent.sends": ("{message}", "send_message calls, by route or error code"),
    "subagent.store.retries": ("{retry}", "store retries of transient failures, by cause"),
    "subagent.steer.duration": ("s", "send_message until steered"),
    "subagent.resume.latency": ("s", "send_message until provider.resume"),
    "subagent.activation.duration": ("s", "admission until settlement"),
    "subagent.activations.live": ("{activation}", "admitted, not yet settled"),
    "subagent.messages.held": ("{message}", "messages waiting for publication"),
    "subagent.supervisors.live": ("{supervisor}", "child supervisors running"),
}
"""Every metric: its unit and what it counts (three counters, three histograms in seconds,
three up-down counters)."""

AGENT_ID: Final = "gen_ai.agent.id"
OPERATION: Final = "gen_ai.operation.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
GENAI_PROVIDER: Final = "gen_ai.provider.name"
ERROR_TYPE: Final = "error.type"
TASK_ID: Final = "subagent.task.id"
ROUTE: Final = "subagent.route"
PROVIDER: Final = "subagent.provider"
OUTCOME: Final = "subagent.outcome.status"
DETAIL: Final = "subagent.outcome.detail"
RUNTIME_ID: Final = "subagent.runtime.id"
CHARS: Final = "subagent.message.chars"
SOURCE: Final = "subagent.message.source"
CAUSE: Final = "subagent.retry.cause"

_P = TypeVar("_P")

_ID_LIMIT = 200
_DETAIL_LIMIT = 1000
# Seconds. A steer is ~0.1-1 ms, a resume's hand-off a few ms, a turn seconds to hours.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_TURN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
                 7200.0, 21600.0, 86400.0)  # fmt: skip


# -- spans and metrics ------------------------------------------------------------------


class _Api:
    """The parts of ``opentelemetry-api`` used on hot paths, looked up once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, StatusCode

        self.get_current = context.get_current
        self.attach = context.attach
        self.detach = context.detach
        self.set_span_in_context = trace.set_span_in_context
        self.get_current_span = trace.get_current_span
        self.get_tracer = trace.get_tracer
        from opentelemetry import metrics
        from opentelemetry.metrics import _internal as metrics_internal

        # Asked on every send (`Telemetry.quiet`).
        self.get_tracer_provider = _provider_getter(
            trace, "_TRACER_PROVIDER", trace.get_tracer_provider
        )
        self.get_meter_provider = _provider_getter(
            metrics_internal, "_METER_PROVIDER", metrics.get_meter_provider
        )
        self.proxy_provider = trace.ProxyTracerProvider
        self.link = Link
        self.error = StatusCode.ERROR


def _provider_getter(module: Any, name: str, getter: Callable[[], _P]) -> Callable[[], _P]:
    """``getter`` (the API's global-provider getter), without its cost while no provider
    is set: it then looks the environment up for a provider to load on every call (~3 µs,
    a caught KeyError), where this reads the global the getter returns.

    The first call here is the API's own, so a provider the environment names is loaded
    now, as the API's first call would load it; one set in code later is seen as set (a
    global provider is set once). The global is private to the API: where it is not found
    by ``name``, the API's getter is returned unchanged."""
    first = getter()
    if not hasattr(module, name):
        return getter
    # The API's stand-in (a proxy) while nothing is set; unknown if a provider was set
    # already (were it unset again, as tests do, the getter is asked).
    stand_in = first if getattr(module, name) is None else None

    def current() -> _P:
        provider = getattr(module, name)
        if provider is not None:
            return cast("_P", provider)
        return stand_in if stand_in is not None else getter()

    return current


_api_lock = threading.Lock()
_api_loaded: list[_Api | None] = []


def _load_api() -> _Api | None:
    """The API, or None when ``opentelemetry-api`` is not installed (tried once)."""
    with _api_lock:
        if not _api_loaded:
            try:
                _api_loaded.append(_Api())
            except ImportError:
                _api_loaded.append(None)
        return _api_loaded[0]


class Origin:
    """Where a start or a send came from, handed to the activation it admits: the trace
    context it ran under (its own span current in it), when it began
    (`time.perf_counter`), and the caller's own span. In memory only: a send forwarded to
    another process does not carry it yet. Immutable (a plain class, not a dataclass, so
    the pydantic messages that carry it check only its type)."""

    __slots__ = ("caller", "context", "started")

    def __init__(
        self, context: Context | None, started: float, caller: SpanContext | None = None
    ) -> None:
        self.context = context
        self.started = started
        self.caller = caller


class _Instruments:
    """The metric instruments of one meter."""

    def __init__(self, provider: MeterProvider | None) -> None:
        from opentelemetry import metrics

        meter = metrics.get_meter(INSTRUMENTATION, meter_provider=provider)
        self.activations: Counter = meter.create_counter(*_named("subagent.activations"))
        self.sends: Counter = meter.create_counter(*_named("subagent.sends"))
        self.retries: Counter = meter.create_counter(*_named("subagent.store.retries"))
        self.steer_s = _histogram(meter, "subagent.steer.duration", _FAST_BUCKETS)
        self.resume_s = _histogram(meter, "subagent.resume.latency", _FAST_BUCKETS)
        self.activation_s = _histogram(meter, "subagent.activation.duration", _TURN_BUCKETS)
        up_down = meter.create_up_down_counter
        self.live: UpDownCounter = up_down(*_named("subagent.activations.live"))
        self.held: UpDownCounter = up_down(*_named("subagent.messages.held"))
        self.supervisors: UpDownCounter = up_down(*_named("subagent.supervisors.live"))


def _named(name: str) -> tuple[str, str, str]:
    unit, description = METRICS[name]
    return name, unit, description


def _histogram(meter: Any, name: str, buckets: tuple[float, ...]) -> Histogram:
    histogram: Histogram = meter.create_histogram(
        *_named(name), explicit_bucket_boundaries_advisory=list(buckets)
    )
    return histogram


class Telemetry:
    """One control plane's spans, metrics and lifecycle logs.

    Args:
        runtime_id: The runtime every lifecycle line and activation span names.
        tracer_provider: Where spans go; the global one (``trace.set_tracer_provider``)
            when None.
        meter_provider: Where metrics go; the global one when None.
        enabled: False turns spans and metrics off whatever is installed (the lifecycle
            logs stay); so does a missing ``opentelemetry-api``.
    """

    __slots__ = ("_api", "_global", "_meter_proxy", "_metrics", "_tracer", "runtime_id")

    def __init__(
        self,
        runtime_id: str = "",
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        enabled: bool = True,
    ) -> None:
        self.runtime_id = runtime_id
        self._api: _Api | None = None
        self._tracer: Tracer | None = None
        self._metrics: _Instruments | None = None
        self._global = tracer_provider is None
        # The API's stand-in global meter provider, while no SDK has replaced it.
        self._meter_proxy: object | None = None
        api = _load_api() if enabled else None
        if api is None:
            return
        self._api = api
        self._tracer = api.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        self._metrics = _Instruments(meter_provider)
        if meter_provider is None:
            current = api.get_meter_provider()
            # Private in the API, so recognized by name: were it renamed, metrics would
            # only be thought configured (the hot paths keep emitting to the stand-in).
            if type(current).__name__ == "_ProxyMeterProvider":
                self._meter_proxy = current

    @property
    def enabled(self) -> bool:
        """Whether spans and metrics go to OpenTelemetry (recorded only if an SDK is set)."""
        return self._tracer is not None

    def copy_from(self, other: Telemetry) -> None:
        """Emit from now on as ``other`` does (the benchmark compares modes on one control
        plane; activations already admitted keep what they began with)."""
        self._api, self._tracer, self._metrics = other._api, other._tracer, other._metrics
        self._global = other._global
        self._meter_proxy = other._meter_proxy

    def quiet(self) -> bool:
        """Whether a send has nothing to emit: no span could be recorded (see `_tracing`),
        no meter provider is set (only the API's stand-in), and the lifecycle logger drops
        INFO. The steer then skips its `Operation` altogether. Asked per call, so a
        provider or a log level the host sets later counts from then on."""
        if lifecycle_enabled(logging.INFO):
            return False
        api = self._api
        if self._metrics is not None and (
            api is None
            or self._meter_proxy is None
            or api.get_meter_provider() is not self._meter_proxy
        ):
            return False
        return self._tracing() is None

    def _tracing(self) -> tuple[Tracer, _Api] | None:
        """The tracer and the API, or None while no span can be recorded: the global
        provider is still the API's proxy (no SDK set yet), whose spans are never recorded
        — skipped, they cost nothing on the hot paths. Asked per operation, so an SDK set
        later is used from then on."""
        tracer, api = self._tracer, self._api
        if tracer is None or api is None:
            return None
        if self._global and isinstance(api.get_tracer_provider(), api.proxy_provider):
            return None
        return tracer, api

    # -- caller-side operations ----------------------------------------------------------

    def start(self) -> Operation:
        """The ``subagent.start`` operation of a `start_continuable` call."""
        return Operation(self, SPAN_START, None)

    def send(self, child_id: object) -> Operation:
        """The ``subagent.send`` operation of a `send_message` call."""
        return Operation(self, SPAN_SEND, child_id if isinstance(child_id, str) else None)

    # -- activations ---------------------------------------------------------------------

    def activation(
        self,
        *,
        task_id: str,
        child_id: str,
        route: str,
        origin: Origin | None,
        chars: int,
        descriptor: Descriptor | None = None,
    ) -> ActivationTrace:
        """Admit an activation: its span begins (a child of ``origin``) and it is counted
        live until `ActivationTrace.end`."""
        log_lifecycle(
            logging.INFO, "start", child_id=child_id, task_id=task_id,
            runtime_id=self.runtime_id, route=route, chars=chars,
            provider=descriptor.provider if descriptor else None,
        )  # fmt: skip
        span = None
        tracing = self._tracing()
        if tracing is not None:
            tracer, api = tracing
            span = tracer.start_span(
                SPAN_ACTIVATION,
                context=origin.context if origin else None,
                links=_links(api, origin),
            )
            if span.is_recording():
                span.set_attributes(
                    {
                        OPERATION: "invoke_agent",
                        AGENT_ID: child_id,
                        TASK_ID: task_id,
                        ROUTE: route,
                        RUNTIME_ID: self.runtime_id,
                    }
                )
        trace = ActivationTrace(self, task_id, child_id, route, origin, span)
        if descriptor is not None:
            trace.describe(descriptor)
        if self._metrics is not None:
            self._metrics.live.add(1, {ROUTE: route})
        return trace

    # -- process-wide gauges -------------------------------------------------------------

    def supervisors_live(self, delta: int) -> None:
        """Child supervisors started (``delta`` > 0) or stopped (< 0)."""
        if self._metrics is not None:
            self._metrics.supervisors.add(delta)

    def held_messages(self, delta: int) -> None:
        """Messages began (> 0) or stopped (< 0) waiting for their activation's publication."""
        if self._metrics is not None and delta:
            self._metrics.held.add(delta)

    def store_retry(self, action: str, attempt: int, cause: str) -> None:
        """The store retries a transient failure (its `SqlStore.on_retry` listener)."""
        child_id, task_id = current_scope()
        log_lifecycle(
            logging.WARNING, "retry", child_id=child_id, task_id=task_id,
            runtime_id=self.runtime_id, cause=cause, attempt=attempt, action=action,
        )  # fmt: skip
        if self._metrics is not None:
            self._metrics.retries.add(1, {CAUSE: cause})

    def scoped(self, child_id: str | None, task_id: str | None = None) -> scoped:
        """`scoped` with this runtime's id."""
        return scoped(self.runtime_id, child_id, task_id)


def _links(api: _Api, origin: Origin | None) -> list[Any] | None:
    """A link to the caller's own span (the tool call that started or sent): the
    activation stays reachable from it even where the start or send span is dropped."""
    if origin is None or origin.caller is None or not origin.caller.is_valid:
        return None
    return [api.link(origin.caller, {"subagent.link": "caller"})]


class Operation:
    """One ``start_continuable`` or ``send_message`` call, on the caller's thread: its
    span (a child of the caller's current span), its metrics and its log line. A context
    manager; a raise on the way out is recorded with its error code and passes on."""

    __slots__ = ("_name", "_source", "_span", "_telemetry", "chars", "child_id", "origin")

    def __init__(self, telemetry: Telemetry, name: str, child_id: str | None) -> None:
        self._telemetry = telemetry
        self._name = name
        self._span: Span | None = None
        self._source: str | None = None
        self.child_id = child_id
        self.chars = 0
        self.origin = Origin(None, time.perf_counter())

    def __enter__(self) -> Operation:
        tracing = self._telemetry._tracing()
        if tracing is None:
            return self
        tracer, api = tracing
        caller = api.get_current()
        span = tracer.start_span(self._name, context=caller)
        if span.is_recording():
            self._span = span
            self.origin = Origin(
                api.set_span_in_context(span, caller),
                self.origin.started,
                api.get_current_span(caller).get_span_context(),
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        code = exc.code.value if isinstance(exc, SubagentControlError) else type(exc).__name__
        task_id = exc.task_id if isinstance(exc, SubagentControlError) else None
        event = "send refused" if self._name == SPAN_SEND else "start refused"
        log_lifecycle(
            logging.INFO, event, child_id=self.child_id, task_id=task_id,
            runtime_id=self._telemetry.runtime_id, code=code, chars=self.chars or None,
        )  # fmt: skip
        metrics = self._telemetry._metrics
        if metrics is not None and self._name == SPAN_SEND:
            metrics.sends.add(1, {ERROR_TYPE: code})
        span, api = self._span, self._telemetry._api
        if span is not None and api is not None:
            span.set_status(api.error, _clip(str(exc)))
            self._end(span, task_id, ERROR_TYPE, code)

    def message(self, blocks: Sequence[TextBlock], source: MessageSource | None = None) -> Origin:
        """Note the validated message's size (logged, never its text); returns the origin
        to hand to the activation this call may admit."""
        self.chars = sum(len(block.text) for block in blocks)
        self._source = source.kind if source is not None else None
        return self.origin

    def admit(
        self, *, task_id: str, child_id: str, route: str, descriptor: Descriptor | None
    ) -> ActivationTrace:
        """The activation this call admitted (`Telemetry.activation` under this call)."""
        self.child_id = child_id
        return self._telemetry.activation(
            task_id=task_id,
            child_id=child_id,
            route=route,
            origin=self.origin,
            chars=self.chars,
            descriptor=descriptor,
        )

    def started(self, start: ContinuableStart) -> ContinuableStart:
        """The start returned: close its span."""
        if self._span is not None:
            self._end(self._span, start.task_id)
        return start

    def sent(self, result: SendResult) -> SendResult:
        """The send was answered ``steered`` or ``started``: count it, time a steer."""
        telemetry = self._telemetry
        if result.route == "steered":
            log_lifecycle(
                logging.INFO, "steer", child_id=self.child_id, task_id=result.task_id,
                runtime_id=telemetry.runtime_id, chars=self.chars,
            )  # fmt: skip
        metrics = telemetry._metrics
        if metrics is not None:
            attributes = {ROUTE: result.route}
            metrics.sends.add(1, attributes)
            if result.route == "steered":
                metrics.steer_s.record(time.perf_counter() - self.origin.started, attributes)
        if self._span is not None:
            self._end(self._span, result.task_id, ROUTE, result.route)
        return result

    def _end(self, span: Span, task_id: str | None, key: str = "", value: str = "") -> None:
        """Set the span's attributes in one call (each call takes the span's lock) and end
        it."""
        attributes: dict[str, str | int] = {RUNTIME_ID: self._telemetry.runtime_id}
        if self._name == SPAN_START:
            attributes[OPERATION] = "create_agent"
        if self.child_id is not None:
            attributes[AGENT_ID] = self.child_id[:_ID_LIMIT]
        if task_id is not None:
            attributes[TASK_ID] = task_id
        if self.chars:
            attributes[CHARS] = self.chars
        if self._source is not None:
            attributes[SOURCE] = self._source
        if key:
            attributes[key] = value
        span.set_attributes(attributes)
        span.end()


class ActivationTrace:
    """One activation's span and timings, from admission to settlement. Thread-safe: the
    supervisor adds steer events while the activation's thread runs its phases."""

    __slots__ = ("_api", "_ended", "_lock", "_span", "_started", "_telemetry", "_tracer",
                 "child_id", "origin", "route", "task_id")  # fmt: skip

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
        span = self._span
        if span is None:
            return
        attributes = {PROVIDER: descriptor.provider}
        if descriptor.agent_model:
            attributes[REQUEST_MODEL] = descriptor.agent_model
        if descriptor.agent_provider:
            attributes[GENAI_PROVIDER] = descriptor.agent_provider
        span.set_attributes(attributes)

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
                attributes[DETAIL] = _clip(outcome.detail)
            if outcome.code is not None:
                attributes[ERROR_TYPE] = outcome.code.value
            span.set_attributes(attributes)
            if status in ("failed", "interrupted"):
                span.set_status(api.error, _clip(outcome.detail or status))
        span.end()


class _Phase:
    """A phase's child span of a recorded activation span."""

    __slots__ = ("_api", "_current", "_name", "_parent", "_span", "_token", "_tracer")

    def __init__(self, api: _Api, tracer: Tracer, parent: Span, name: str, current: bool) -> None:
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
            code = exc.code.value if isinstance(exc, SubagentControlError) else type(exc).__name__
            span.set_attribute(ERROR_TYPE, code)
            span.set_status(self._api.error, _clip(str(exc)))
        span.end()


class _NoPhase:
    """The phase of an activation whose span is not recorded: nothing at all."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_PHASE: Final = _NoPhase()


def _clip(text: str) -> str:
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"


NO_TELEMETRY: Final = Telemetry(enabled=False)
"""Emits nothing but the lifecycle logs (no runtime id): the default of `ActorContext`."""

NO_TRACE: Final = ActivationTrace(NO_TELEMETRY, "", "", "initial", None, None)
"""The trace of an activation nobody admitted through a `Telemetry` (a plan built by
hand); its `end` does nothing that shows."""
