"""`Operation`: one ``start_continuable``, ``send_message`` or ``tasks.kill`` call on the
caller's thread — its span, its metrics and its log line.

Apart from `controlplane.telemetry._telemetry` (which makes them, `Telemetry.start`,
`.send`, `.kill`) because it is the caller's side, where the activation's trace is the
supervisor's; the import runs one way, here to nothing of `_telemetry` but its type.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from controlplane.contract import Origin, SubagentControlError
from controlplane.telemetry._lifecycle import log_lifecycle
from controlplane.telemetry._otel import (
    AGENT_ID,
    CHARS,
    ERROR_TYPE,
    OPERATION,
    ROUTE,
    RUNTIME_ID,
    SOURCE,
    SPAN_KILL,
    SPAN_SEND,
    SPAN_START,
    TASK_ID,
    clip,
    error_type,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from controlplane.contract import (
        ContinuableStart,
        Descriptor,
        MessageSource,
        SendResult,
        TextBlock,
    )
    from controlplane.telemetry._activation_trace import SpanTrace
    from controlplane.telemetry._telemetry import Telemetry

__all__ = ["ID_LIMIT", "Operation"]

ID_LIMIT = 200
"""The longest child id an attribute keeps (a refused send's id may be anything)."""


class Operation:
    """One ``start_continuable`` or ``send_message`` call, on the caller's thread: its
    span (a child of the caller's current span), its metrics and its log line. A context
    manager; a raise on the way out is recorded with its error code and passes on."""

    __slots__ = ("_name", "_source", "_span", "_telemetry", "_token", "chars", "child_id",
                 "origin", "task_id")  # fmt: skip

    def __init__(self, telemetry: Telemetry, name: str, child_id: str | None) -> None:
        self._telemetry = telemetry
        self._name = name
        self._span: Span | None = None
        self._source: str | None = None
        self.child_id = child_id
        self.task_id: str | None = None
        self.chars = 0
        self.origin = Origin(None, time.perf_counter())
        self._token: Any = None

    def __enter__(self) -> Operation:
        tracing = self._telemetry._tracing()
        if tracing is None:
            return self
        tracer, api = tracing
        caller = api.get_current()
        span = tracer.start_span(self._name, context=caller)
        if span.is_recording():
            self._span = span
            context = api.set_span_in_context(span, caller)
            self.origin = Origin(
                context, self.origin.started, api.get_current_span(caller).get_span_context()
            )
            # Current on the caller's thread meanwhile: the steer it makes names it, and
            # a send or kill forwarded to another runtime carries it.
            self._token = api.attach(context)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        api = self._telemetry._api
        if self._token is not None and api is not None:
            api.detach(self._token)
        if self._name == SPAN_KILL:
            self._killed(exc)
            return
        if exc is None:
            return
        code = error_type(exc)
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
            span.set_status(api.error, clip(str(exc)))
            self._end(span, task_id, ERROR_TYPE, code)

    def _killed(self, exc: BaseException | None) -> None:
        span, api = self._span, self._telemetry._api
        if span is None or api is None:
            return
        if exc is None:
            self._end(span, self.task_id)
            return
        span.set_status(api.error, clip(str(exc)))
        self._end(span, self.task_id, ERROR_TYPE, error_type(exc))

    def message(self, blocks: Sequence[TextBlock], source: MessageSource | None = None) -> Origin:
        """Note the validated message's size (logged, never its text); returns the origin
        to hand to the activation this call may admit."""
        self.chars = sum(len(block.text) for block in blocks)
        self._source = source.kind if source is not None else None
        return self.origin

    def admit(
        self, *, task_id: str, child_id: str, route: str, descriptor: Descriptor | None
    ) -> SpanTrace:
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
            attributes[AGENT_ID] = self.child_id[:ID_LIMIT]
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
