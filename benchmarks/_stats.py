"""Summaries of timing samples: percentiles per run, medians across runs, and spreads.

Every figure the report prints is the median over several runs, with the min–max of those
runs beside it; a ratio is computed inside each run (both sides measured back to back) and
then summarised the same way, so machine noise that hits one run hits both sides of it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Spread",
    "fmt_count",
    "fmt_kib",
    "fmt_mib",
    "fmt_ratio",
    "fmt_s",
    "growth_verdict",
    "percentile",
    "sample",
    "sample_interleaved",
    "spread",
]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``samples``, linearly interpolated."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of several runs' values, and the smallest and largest of them."""

    median: float
    low: float
    high: float
    runs: int


def spread(values: Sequence[float]) -> Spread:
    """Summarise one value per run."""
    if not values:
        raise ValueError("no runs")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def sample(op: Callable[[], object], count: int) -> list[float]:
    """Time ``count`` calls of ``op`` (seconds each, `time.perf_counter`)."""
    clock = time.perf_counter
    out = []
    for _ in range(count):
        t0 = clock()
        op()
        out.append(clock() - t0)
    return out


def sample_interleaved(
    ops: Mapping[str, Callable[[], object]], count: int, *, chunk: int = 20
) -> dict[str, list[float]]:
    """Time ``count`` calls of every op, in turns of ``chunk`` calls each (order rotating).

    Within a turn an op runs warm, as in a tight loop; alternating the ops every ``chunk``
    calls spreads a burst of outside load over all of them, so the ratios between them
    survive it better than when each op is timed in one long block.
    """
    clock = time.perf_counter
    items = list(ops.items())
    out: dict[str, list[float]] = {name: [] for name in ops}
    for turn in range(-(-count // chunk)):
        shift = turn % len(items)
        calls = min(chunk, count - turn * chunk)
        for name, op in items[shift:] + items[:shift]:
            samples = out[name]
            for _ in range(calls):
                t0 = clock()
                op()
                samples.append(clock() - t0)
    return out


def growth_verdict(growth: Spread, more: str) -> str:
    """Whether a per-run ratio (bigger case / smaller case) shows growth: none when the
    runs' range spans 1×, otherwise which way, with ``more`` naming what grew."""
    if growth.runs == 1:
        return "one run only, no verdict"
    if growth.low <= 1.0 <= growth.high:
        return "no measurable growth (the runs' range spans 1×)"
    return f"**{'slower' if growth.median > 1 else 'faster'} with more {more}**"


def fmt_s(value: float | Spread, *, with_spread: bool = True) -> str:
    """A duration (seconds) in µs/ms/s, with the run spread when given a `Spread`."""
    if isinstance(value, Spread):
        text = _duration(value.median)
        if with_spread and value.runs > 1:
            text += f" ({_duration(value.low)}–{_duration(value.high)})"
        return text
    return _duration(value)


def fmt_ratio(value: Spread) -> str:
    """A ratio with its run spread: ``1.23× (1.10–1.31)``."""
    text = f"{value.median:.2f}×"
    if value.runs > 1:
        text += f" ({value.low:.2f}–{value.high:.2f})"
    return text


def fmt_count(value: Spread, unit: str = "") -> str:
    """A count or rate with its run spread, thousands separated."""
    suffix = f" {unit}" if unit else ""
    text = f"{value.median:,.0f}{suffix}"
    if value.runs > 1:
        text += f" ({value.low:,.0f}–{value.high:,.0f})"
    return text


def fmt_mib(value: Spread) -> str:
    """A size in bytes as MiB, with its run spread."""
    return _size(value, 1024.0 * 1024.0, "MiB")


def fmt_kib(value: Spread) -> str:
    """A size in bytes as KiB, with its run spread."""
    return _size(value, 1024.0, "KiB")


def _size(value: Spread, unit: float, name: str) -> str:
    text = f"{value.median / unit:.1f} {name}"
    if value.runs > 1:
        text += f" ({value.low / unit:.1f}–{value.high / unit:.1f})"
    return text


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
