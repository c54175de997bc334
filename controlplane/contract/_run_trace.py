"""What a provider's run tells the activation's trace (``request.trace``), without OTel.

A run does its work on threads of its own (the agent loop's, the ACP client's event loop),
where the activation's span is not current: a span the run or a library opens there would
start a trace of its own. `RunTrace` is the hook a provider uses instead of importing
OpenTelemetry: `current` makes the activation's context current on the calling thread,
`model_call` and `tool_call` wrap one model call and one child tool call. Every method here
is a no-op; `controlplane.telemetry.SpanTrace` implements them when the ``otel`` extra is
installed and a span is recorded, so a provider calls them unconditionally.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Final

__all__ = ["NO_RUN_TRACE", "ModelCallTrace", "RunTrace", "Suspended"]

_NULL: Final[AbstractContextManager[None]] = contextlib.nullcontext()


class Suspended(Exception):
    """A raise that ends a traced call without failing it: the run parked on an approval
    request and goes on later, elsewhere perhaps. Its span ends unfailed."""


class ModelCallTrace:
    """One model call's span (a context manager); this base records nothing."""

    __slots__ = ()

    def __enter__(self) -> ModelCallTrace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """The tokens the server reported for this call, once known (None: not reported)."""
        return None


_NO_CALL: Final = ModelCallTrace()


class RunTrace:
    """The activation's trace as a provider's run sees it (``request.trace``). Thread-safe;
    every method is a no-op here."""

    __slots__ = ()

    def current(self) -> AbstractContextManager[None]:
        """Make the activation's trace context current on this thread meanwhile (wrap a
        thread's body, or each request an event loop sends)."""
        return _NULL

    def calling_model(self, model: str | None) -> ModelCallTrace:
        """A client span around one model call (``chat {model}``), a child of the
        context current on this thread."""
        return _NO_CALL

    def calling_tool(self, name: str) -> AbstractContextManager[None]:
        """A span around one child tool call (``execute_tool {name}``), approval included."""
        return _NULL


NO_RUN_TRACE: Final = RunTrace()
"""The run trace of a request built without telemetry: nothing at all."""
