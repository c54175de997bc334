"""Observability (issue 17): what the spans, metrics and lifecycle logs cost a steer and a
resume.

One control plane on SQLite, its telemetry switched between modes inside each round
(`Telemetry.copy_from`), every mode timed in short interleaved turns:

- ``off``: the hard no-op, as without ``opentelemetry-api`` (only the lifecycle log calls
  remain, below the logger's level);
- ``off again``: the same, a second time: the A/A ratio is the noise floor of the rest;
- ``api``: ``opentelemetry-api`` imported, no SDK configured (the API's proxy tracer and
  meter, as a host that installed the extra but exports nothing). Goal: p50 ≤ 1.03× off;
- ``sdk``: the OpenTelemetry SDK with a `SimpleSpanProcessor` into an in-memory exporter
  and an in-memory metric reader: everything recorded and exported synchronously.

Each mode steers its own pool of live children, admitted under that mode (an activation
keeps the telemetry it was admitted with), so a steer pays exactly its mode's cost.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks._harness import PARENT_SESSION, frozen_gc, seed_child, sqlite_url
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, percentile, sample_interleaved, spread
from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    MessageSource,
    SubagentControl,
    TextBlock,
)
from controlplane.telemetry import Telemetry

__all__ = ["TelemetryConfig", "run_telemetry"]

_TEXT = "Also check the migration for the events table; keep seq gapless."
_MESSAGE = [TextBlock(text=_TEXT)]
_SOURCE = MessageSource(kind="coordinator", sender_session_id=PARENT_SESSION)
_MODES = ("off", "off again", "api", "sdk")
_GOAL = 1.03


@dataclass(frozen=True)
class TelemetryConfig:
    """How much to measure."""

    live_per_mode: int = 50
    rounds: int = 9
    ops: int = 600
    resume_ops: int = 100
    resume_pool: int = 8

    @classmethod
    def quick(cls) -> TelemetryConfig:
        """A smoke run: small, seconds."""
        return cls(live_per_mode=5, rounds=2, ops=40, resume_ops=4, resume_pool=2)


@dataclass
class _Samples:
    """Per round, each mode's p50 (seconds) of a steer and of a resume."""

    steer: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in _MODES})
    resume: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in _MODES})


def run_telemetry(config: TelemetryConfig, workdir: Path) -> Section | None:
    """Measure every mode; None when opentelemetry-api or -sdk is missing (the
    ``otel`` extra and the SDK come with ``pip install -e '.[bench]'``)."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        raise RuntimeError("a global tracer provider is set: the api mode would not be bare")
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    control = SubagentControl.open(sqlite_url(workdir / "telemetry.db"))
    modes = {
        "off": Telemetry(control.runtime_id, enabled=False),
        "off again": Telemetry(control.runtime_id, enabled=False),
        "api": Telemetry(control.runtime_id),
        "sdk": Telemetry(
            control.runtime_id, tracer_provider=tracer_provider, meter_provider=meter_provider
        ),
    }
    provider = BenchProvider()
    control.providers.register(provider)
    parent = control.agents.register(PARENT_SESSION)
    samples = _Samples()
    rng = random.Random(7)
    try:
        store = control.store
        assert store is not None
        pools = {m: _grow(control, parent, modes[m], config.live_per_mode) for m in _MODES}
        idle = [seed_child(store, 10) for _ in range(config.resume_pool)]
        for child_id in idle:  # the first send also creates the supervisor: not timed
            _resume(control, parent, provider, child_id)
        with frozen_gc():
            for _ in range(config.rounds):
                steer = {
                    m: partial(_steer, control, parent, modes[m], pools[m], rng) for m in _MODES
                }
                # Call by call: a 3% difference drowns in the drift of the CPU's wake-up
                # cost between turns of 20 (measured: ±10-25% between identical modes).
                for mode, timed in sample_interleaved(steer, config.ops, chunk=1).items():
                    samples.steer[mode].append(percentile(timed, 50))
                resumes = _time_resumes(control, parent, provider, modes, idle, config)
                for mode, timed in resumes.items():
                    samples.resume[mode].append(percentile(timed, 50))
                exporter.clear()  # memory: the exporter keeps every span until cleared
    finally:
        provider.release_all()
        control.close()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    return _section(config, samples)


def _grow(control: SubagentControl, parent: AgentHandle, mode: Telemetry, count: int) -> list[str]:
    """``count`` live, published children admitted under ``mode``."""
    control.telemetry.copy_from(mode)
    started = [
        control.start_continuable(
            ContinuableStartSpec(
                provider=PROVIDER_NAME, label="bench", prompt=[TextBlock(text="go")], parent=parent
            )
        ).child_id
        for _ in range(count)
    ]
    for child_id in started:  # returns once published and delivered
        control.send_message(parent, child_id, _MESSAGE, _SOURCE)
    return started


def _steer(
    control: SubagentControl,
    parent: AgentHandle,
    mode: Telemetry,
    pool: list[str],
    rng: random.Random,
) -> None:
    control.telemetry.copy_from(mode)
    if control.send_message(parent, rng.choice(pool), _MESSAGE, _SOURCE).route != "steered":
        raise AssertionError("expected a steer")


def _time_resumes(
    control: SubagentControl,
    parent: AgentHandle,
    provider: BenchProvider,
    modes: dict[str, Telemetry],
    idle: list[str],
    config: TelemetryConfig,
) -> dict[str, list[float]]:
    """Resume latencies per mode, the modes taking turns call by call."""
    out: dict[str, list[float]] = {m: [] for m in _MODES}
    calls: list[Callable[[], None]] = []
    for i in range(config.resume_ops):
        for mode in _MODES:
            child_id = idle[(i * len(_MODES) + _MODES.index(mode)) % len(idle)]

            def call(mode: str = mode, child_id: str = child_id) -> None:
                control.telemetry.copy_from(modes[mode])
                out[mode].append(_resume(control, parent, provider, child_id))

            calls.append(call)
    for call in calls:
        call()
    return out


def _resume(
    control: SubagentControl, parent: AgentHandle, provider: BenchProvider, child_id: str
) -> float:
    """Seconds from ``send_message`` to an idle child until ``provider.resume``."""
    t0 = time.perf_counter()
    result = control.send_message(parent, child_id, _MESSAGE, _SOURCE)
    called, run, _request = provider.wait_resumed(child_id)
    run.release()
    control.tasks.wait(result.task_id, timeout=60.0, requester=parent)
    return called - t0


def _section(config: TelemetryConfig, samples: _Samples) -> Section:
    rows = []
    verdicts = []
    for name, p50 in (("steer", samples.steer), ("resume", samples.resume)):
        base = p50["off"]
        api = _ratio(p50["api"], base)
        verdicts.append(api.median <= _GOAL)
        rows.append(
            [
                name,
                fmt_s(spread(base)),
                fmt_ratio(_ratio(p50["off again"], base)),
                fmt_s(spread(p50["api"])),
                fmt_ratio(api),
                fmt_s(spread(p50["sdk"])),
                fmt_ratio(_ratio(p50["sdk"], base)),
                fmt_s(spread([s - b for s, b in zip(p50["sdk"], base, strict=True)])),
            ]
        )
    verdict = "met" if all(verdicts) else "**not met**"
    header = ["path", "off p50", "off again / off", "api p50", "api / off", "sdk p50"]
    cost_table = table([*header, "sdk / off", "sdk − off"], rows)
    body = f"""\
What the instrumentation costs the two hot paths (SQLite store). One control plane, its
telemetry switched between modes call by call: **off** is the hard no-op (as without
`opentelemetry-api`), **off again** the same a second time (its ratio is the noise floor),
**api** has `opentelemetry-api` imported but no SDK configured (the API's proxy tracer and
meter), **sdk** records everything through the OpenTelemetry SDK (a `SimpleSpanProcessor`
into an in-memory span exporter, an in-memory metric reader). Each mode steers its own
{config.live_per_mode} live children, admitted under that mode; {config.rounds} rounds of
{config.ops} steers and {config.resume_ops} resumes (send until `provider.resume`, small
transcript) per mode, the modes taking turns call by call (in turns of 20, the drift of the
CPU's wake-up cost moved identical modes 10–25% apart). A figure is the median of the
rounds' p50, with the rounds' min–max; ratios are taken inside each round.

Goal (issue 17): with the API and no SDK, steer and resume p50 ≤ {_GOAL}× off — {verdict}.
The lifecycle log lines are the same in every mode (below the logger's level here, as in a
host that does not log INFO).

{cost_table}

What the SDK adds is the spans and points themselves: a steer records one `subagent.send`
span, a steer event on its activation's span, a count and a histogram point; a resume
starts the `subagent.send` and `subagent.activation` spans and the phase spans up to
`provider.resume`, and a histogram point. Exporting in batches
(`BatchSpanProcessor`, the usual production choice) moves the export off the calling
thread.
"""
    return Section("Observability", body, {"goal_met": all(verdicts)})


def _ratio(num: list[float], den: list[float]) -> Spread:
    return spread([x / y for x, y in zip(num, den, strict=True)])
