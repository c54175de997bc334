"""Observability: OpenTelemetry spans and metrics, and the lifecycle lines of the logs.

Depends only on ``opentelemetry-api``, and only when it is installed (the ``otel`` extra):
without it every hook here is a no-op costing an attribute test, and with it but no SDK
configured the API's own no-op tracer and meter answer (the spans are never recorded).
The API is imported when a control plane is built, never at ``import controlplane``
(`controlplane.telemetry._otel` loads it, and names everything emitted).

Everything the actors and the facade emit goes through one `Telemetry` per control plane:

- ``subagent.start``, ``subagent.send`` and ``subagent.kill`` spans on the caller's thread,
  children of the caller's current span (the parent's tool call) and current meanwhile:
  an `Operation`, here;
- one ``subagent.activation`` span per activation, from admission to settlement, a child of
  the start or send that admitted it, with child spans for its phases (`PHASES`) and, on
  the run's own threads, its model and tool calls: an `SpanTrace`
  (`controlplane.telemetry._activation_trace`, `controlplane.telemetry._run_spans`);
- W3C ``traceparent`` out with a forwarded send or kill (`Telemetry.carrier`), and in as a
  ``subagent.deliver`` span where it is delivered (`Telemetry.delivering`);
- the metric instruments (`METRICS`);
- the lifecycle log lines it owns (`controlplane.telemetry._lifecycle`): start, publish, steer,
  retry.

This module is the one the rest of the code imports these from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from controlplane.telemetry._activation_trace import SpanTrace
from controlplane.telemetry._lifecycle import (
    current_scope,
    lifecycle_enabled,
    log_lifecycle,
    scoped,
)
from controlplane.telemetry._operation import ID_LIMIT, Operation
from controlplane.telemetry._otel import (
    AGENT_ID,
    CAUSE,
    ERROR_TYPE,
    INSTRUMENTATION,
    METRICS,
    OPERATION,
    PHASES,
    ROUTE,
    RUNTIME_ID,
    SPAN_ACTIVATION,
    SPAN_DELIVER,
    SPAN_KILL,
    SPAN_SEND,
    SPAN_START,
    TASK_ID,
    TRACEPARENT,
    Instruments,
    clip,
    error_type,
    load_api,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

    from controlplane.contract import (
        Descriptor,
        Origin,
    )
    from controlplane.telemetry._otel import (
        Api,
    )

__all__ = [
    "METRICS",
    "PHASES",
    "Operation",
    "SpanTrace",
    "Telemetry",
]


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
        self._api: Api | None = None
        self._tracer: Tracer | None = None
        self._metrics: Instruments | None = None
        self._global = tracer_provider is None
        # The API's stand-in global meter provider, while no SDK has replaced it.
        self._meter_proxy: object | None = None
        api = load_api() if enabled else None
        if api is None:
            return
        self._api = api
        self._tracer = api.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        self._metrics = Instruments(meter_provider)
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

    def _tracing(self) -> tuple[Tracer, Api] | None:
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

    def kill(self, task_id: object) -> Operation:
        """The ``subagent.kill`` operation of a `tasks.kill` call (its span ends as the
        call returns)."""
        operation = Operation(self, SPAN_KILL, None)
        operation.task_id = task_id if isinstance(task_id, str) else None
        return operation

    # -- across processes (W3C Trace Context) --------------------------------------------

    def carrier(self) -> dict[str, str]:
        """The calling thread's trace context as ``{"traceparent": …}``, for a send or
        kill forwarded to another runtime; empty when there is none to carry."""
        api = self._api
        if api is None or not api.get_current_span().get_span_context().is_valid:
            return {}
        carrier: dict[str, str] = {}
        api.propagator.inject(carrier)
        return carrier

    @contextlib.contextmanager
    def delivering(self, kind: str, child_id: str, carried: dict[str, Any]) -> Iterator[None]:
        """A forwarded send or kill is delivered here: its ``traceparent`` is taken out of
        ``carried`` (the item's source), and a ``subagent.deliver`` span, continuing the
        sender's trace, is current meanwhile (the steer links it to the activation)."""
        traceparent = carried.pop(TRACEPARENT, None)
        tracing = self._tracing()
        if tracing is None:
            yield
            return
        tracer, api = tracing
        parent = (
            api.propagator.extract({TRACEPARENT: traceparent})
            if isinstance(traceparent, str)
            else None
        )
        attributes = {AGENT_ID: child_id[:ID_LIMIT], "subagent.forwarded.kind": kind,
                      RUNTIME_ID: self.runtime_id}  # fmt: skip
        span = tracer.start_span(
            SPAN_DELIVER, context=parent, kind=api.consumer, attributes=attributes
        )
        token = api.attach(api.set_span_in_context(span, parent))
        try:
            yield
        except BaseException as exc:
            span.set_attribute(ERROR_TYPE, error_type(exc))
            span.set_status(api.error, clip(str(exc)))
            raise
        finally:
            api.detach(token)
            span.end()

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
    ) -> SpanTrace:
        """Admit an activation: its span begins (a child of ``origin``) and it is counted
        live until `SpanTrace.end`."""
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
        trace = SpanTrace(self, task_id, child_id, route, origin, span)
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


def _links(api: Api, origin: Origin | None) -> list[Any] | None:
    """A link to the caller's own span (the tool call that started or sent): the
    activation stays reachable from it even where the start or send span is dropped."""
    if origin is None or origin.caller is None or not origin.caller.is_valid:
        return None
    return [api.link(origin.caller, {"subagent.link": "caller"})]
