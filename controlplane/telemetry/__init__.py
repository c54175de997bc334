"""Observability: OpenTelemetry spans and metrics, and the lifecycle lines of the logs.

One `Telemetry` per control plane; each activation's `SpanTrace`. The runtime builds
them and hands them to the actors, which see them only through the contract's interfaces
(`controlplane.contract.Telemetry`, `controlplane.contract.ActivationTrace`): this package
sits above the contract and below the runtime, and imports neither the actors nor the
store. The OpenTelemetry API is imported when a `Telemetry` is built, never here.
"""

from controlplane.telemetry._activation_trace import SpanTrace
from controlplane.telemetry._lifecycle import (
    LIFECYCLE_LOGGER,
    log_kill,
    log_lifecycle,
    log_settled,
    scoped,
)
from controlplane.telemetry._otel import METRICS, PHASES
from controlplane.telemetry._telemetry import Operation, Telemetry

__all__ = [
    "LIFECYCLE_LOGGER",
    "METRICS",
    "PHASES",
    "Operation",
    "SpanTrace",
    "Telemetry",
    "log_kill",
    "log_lifecycle",
    "log_settled",
    "scoped",
]
