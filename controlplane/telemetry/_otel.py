"""What the control plane takes from ``opentelemetry-api``: the API itself, the metric
instruments, and the names every span, attribute and metric is emitted under.

The API is the ``otel`` extra, so it is imported here only when a control plane is built
(`load_api`, tried once), never at ``import controlplane``; without it `load_api` answers
None and nothing in this module is touched again. It is kept apart from
`controlplane.telemetry._telemetry`, which decides what to emit and when, because this is the one
place that knows the API's module layout (down to two private globals), and the one list
of names a dashboard is built against.

Names follow the OpenTelemetry GenAI semantic conventions where one fits
(``gen_ai.agent.id``, ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.provider.name``, ``error.type``); the rest are ``subagent.*``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from controlplane.contract import SubagentControlError

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, MeterProvider, UpDownCounter

__all__ = [
    "AGENT_ID",
    "CAUSE",
    "CHARS",
    "DETAIL",
    "ERROR_TYPE",
    "GENAI_PROVIDER",
    "GENAI_SYSTEM",
    "INSTRUMENTATION",
    "METRICS",
    "OPERATION",
    "OUTCOME",
    "PHASES",
    "PROVIDER",
    "REQUEST_MODEL",
    "ROUTE",
    "RUNTIME_ID",
    "SOURCE",
    "SPAN_ACTIVATION",
    "SPAN_DELIVER",
    "SPAN_KILL",
    "SPAN_SEND",
    "SPAN_START",
    "TASK_ID",
    "TOKEN_TYPE",
    "TRACEPARENT",
    "Api",
    "Instruments",
    "clip",
    "error_type",
    "load_api",
]

INSTRUMENTATION: Final = "subagent-control"

SPAN_START: Final = "subagent.start"
SPAN_SEND: Final = "subagent.send"
SPAN_ACTIVATION: Final = "subagent.activation"
SPAN_KILL: Final = "subagent.kill"
SPAN_DELIVER: Final = "subagent.deliver"
TRACEPARENT: Final = "traceparent"
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
    "gen_ai.client.token.usage": ("{token}", "Measures number of input and output tokens used"),
}
"""Every metric: its unit and what it counts (three counters, three histograms in seconds,
three up-down counters, and the GenAI semantic conventions' token usage histogram, one
value per token type per model call)."""

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
TOKEN_TYPE: Final = "gen_ai.token.type"
GENAI_SYSTEM: Final = "gen_ai.system"
"""The provider's older name in the GenAI conventions, still read by many backends."""

_P = TypeVar("_P")

_DETAIL_LIMIT = 1000
# Seconds. A steer is ~0.1-1 ms, a resume's hand-off a few ms, a turn seconds to hours.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
# The GenAI semantic conventions' advisory boundaries for gen_ai.client.token.usage.
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                  16777216, 67108864)  # fmt: skip
_TURN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
                 7200.0, 21600.0, 86400.0)  # fmt: skip


class Api:
    """The parts of ``opentelemetry-api`` used on hot paths, looked up once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, StatusCode

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
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.link = Link
        # W3C Trace Context (`traceparent`): what a forwarded send or kill carries.
        self.propagator = TraceContextTextMapPropagator()
        self.client, self.internal = SpanKind.CLIENT, SpanKind.INTERNAL
        self.consumer, self.producer = SpanKind.CONSUMER, SpanKind.PRODUCER
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
_api_loaded: list[Api | None] = []


def load_api() -> Api | None:
    """The API, or None when ``opentelemetry-api`` is not installed (tried once)."""
    with _api_lock:
        if not _api_loaded:
            try:
                _api_loaded.append(Api())
            except ImportError:
                _api_loaded.append(None)
        return _api_loaded[0]


class Instruments:
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
        self.tokens = _histogram(meter, "gen_ai.client.token.usage", _TOKEN_BUCKETS)
        up_down = meter.create_up_down_counter
        self.live: UpDownCounter = up_down(*_named("subagent.activations.live"))
        self.held: UpDownCounter = up_down(*_named("subagent.messages.held"))
        self.supervisors: UpDownCounter = up_down(*_named("subagent.supervisors.live"))


def _named(name: str) -> tuple[str, str, str]:
    unit, description = METRICS[name]
    return name, unit, description


def _histogram(meter: Any, name: str, buckets: tuple[float, ...] | tuple[int, ...]) -> Histogram:
    histogram: Histogram = meter.create_histogram(
        *_named(name), explicit_bucket_boundaries_advisory=list(buckets)
    )
    return histogram


def clip(text: str) -> str:
    """``text`` cut to the length kept in a span's status or attribute (details, errors)."""
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"


def error_type(exc: BaseException) -> str:
    """The ``error.type`` of a raise: our error's code, else the exception's class name."""
    return exc.code.value if isinstance(exc, SubagentControlError) else type(exc).__name__
