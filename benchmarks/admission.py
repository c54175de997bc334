"""Admission control (issue 26, SPEC §11 "Concurrency limits"): what a queued activation
pays to start once a slot frees, against a plain resume, ratio in the same run.

- Queued start (or queued resume): under ``concurrency={"bench": 1}``, a holder runs; a
  second child's start (or a follow-up to an idle child) is answered ``started`` and waits
  at its gate, ``queued``. The clock starts when the holder's Task settles (its
  ``on_done``, right after the settlement is in the store) and stops when the provider is
  called for the queued child: the release, the wake-up, the admission transaction, the
  gate's return (for a resume, the turn's frame write too) and the provider call.
- Plain resume: a follow-up to an idle child under no limit, from ``send_message`` to the
  provider's ``resume`` — the figure the issue compares with (goal: ≤ 2×).

Both sides are sampled alternately in each run, on SQLite and (when reachable) PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import pg_schema, sqlite_url
from benchmarks._provider import PROVIDER_NAME, BenchProvider, BenchRun
from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, percentile, spread
from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    StartRequest,
    SubagentControl,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)

__all__ = ["AdmissionConfig", "run_admission"]

_GOAL = 2.0
_WAIT_S = 30.0
_PARENT = "bench-admission"


@dataclass(frozen=True)
class AdmissionConfig:
    """How much to measure."""

    rounds: int = 5
    samples: int = 30

    @classmethod
    def quick(cls) -> AdmissionConfig:
        """A smoke run: small, seconds."""
        return cls(rounds=2, samples=5)


class _StartTimes(BenchProvider):
    """`BenchProvider` that also remembers when ``start`` was called for each child."""

    def __init__(self) -> None:
        super().__init__()
        self._started: dict[str, float] = {}

    def start(self, request: StartRequest, signal: CancelSignal) -> BenchRun:
        called = time.perf_counter()
        run = super().start(request, signal)
        with self._lock:
            self._started[request.child_id] = called
            self._lock.notify_all()
        return run

    def wait_started(self, child_id: str) -> float:
        with self._lock:
            if not self._lock.wait_for(lambda: child_id in self._started, _WAIT_S):
                raise TimeoutError(f"provider.start was not called for {child_id}")
            return self._started.pop(child_id)


class _Side:
    """One control plane with the bench provider and a parent."""

    def __init__(self, url: str, limited: bool) -> None:
        options = {"concurrency": {PROVIDER_NAME: 1}} if limited else {}
        self.control = SubagentControl.open(url, **options)  # type: ignore[arg-type]
        self.provider = _StartTimes()
        self.control.providers.register(self.provider)
        self.parent = self.control.agents.register(_PARENT)
        self._settled: dict[str, float] = {}
        self._cond = threading.Condition()
        self.control.tasks.on_done(self._on_done)

    def _on_done(self, snapshot: TaskSnapshot) -> None:
        with self._cond:
            self._settled[snapshot.id] = time.perf_counter()
            self._cond.notify_all()

    def settled_at(self, task_id: str) -> float:
        with self._cond:
            if not self._cond.wait_for(lambda: task_id in self._settled, _WAIT_S):
                raise TimeoutError(f"task {task_id} did not settle")
            return self._settled.pop(task_id)

    def start(self, label: str) -> tuple[str, str]:
        spec = ContinuableStartSpec(
            provider=PROVIDER_NAME, label=label, prompt=[TextBlock(text=label)], parent=self.parent
        )
        started = self.control.start_continuable(spec)
        return started.child_id, started.task_id

    def idle_child(self) -> str:
        child_id, task_id = self.start("idle")
        self.provider.wait_started(child_id)
        self.provider.runs[child_id].release()
        self.wait(task_id)
        return child_id

    def wait(self, task_id: str) -> None:
        snapshot = self.control.tasks.wait(task_id, timeout=_WAIT_S, requester=self.parent)
        assert snapshot.status is TaskStatus.COMPLETED, snapshot
        self.settled_at(task_id)

    def wait_queued(self, task_id: str) -> None:
        """Until the queued Task waits at its gate (bounded; a benchmark may peek)."""
        admission = self.control._admission
        assert admission is not None
        deadline = time.monotonic() + _WAIT_S
        pause = threading.Event()
        while not _gate_waits(admission, task_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task_id} never waited for a slot")
            pause.wait(0.0005)

    def close(self) -> None:
        self.provider.release_all()
        self.control.close()


def _gate_waits(admission: Any, task_id: str) -> bool:
    """Whether ``task_id``'s gate waits for a slot. `--against` runs this code on other
    trees too: one whose gates wait in a dict of their own (``_waiters``) reads there."""
    waiters = getattr(admission, "_waiters", None)
    if waiters is not None:
        return task_id in waiters
    entered = admission._entered.get(task_id)
    return entered is not None and bool(entered.waiting)


def run_admission(
    config: AdmissionConfig, workdir: Path, pg_url: str | None, pg_note: str
) -> Section:
    """Measure both queued admissions against a plain resume, per backend."""
    rows: dict[str, dict[str, Spread]] = {}
    rows["SQLite"] = _backend(
        config,
        sqlite_url(workdir / "admission-limited.db"),
        sqlite_url(workdir / "admission-plain.db"),
    )
    if pg_url is not None:
        with pg_schema(pg_url) as limited, pg_schema(pg_url) as plain:
            rows["PostgreSQL"] = _backend(config, limited, plain)
    return Section("Admission control", _body(config, rows, pg_url is None and pg_note), {})


def _backend(config: AdmissionConfig, limited_url: str, plain_url: str) -> dict[str, Spread]:
    limited, plain = _Side(limited_url, True), _Side(plain_url, False)
    try:
        queued_idle = limited.idle_child()
        plain_idle = plain.idle_child()
        per_round: dict[str, list[float]] = {"start": [], "resume": [], "plain": []}
        ratios: dict[str, list[float]] = {"start": [], "resume": []}
        for _ in range(config.rounds):
            samples: dict[str, list[float]] = {"start": [], "resume": [], "plain": []}
            for _ in range(config.samples):
                samples["plain"].append(_plain_resume(plain, plain_idle))
                samples["start"].append(_queued(limited, None))
                samples["resume"].append(_queued(limited, queued_idle))
            medians = {name: percentile(values, 50) for name, values in samples.items()}
            for name, value in medians.items():
                per_round[name].append(value)
            for name in ratios:
                ratios[name].append(medians[name] / medians["plain"])
        out = {name: spread(values) for name, values in per_round.items()}
        out |= {f"{name}_ratio": spread(values) for name, values in ratios.items()}
        return out
    finally:
        limited.close()
        plain.close()


def _plain_resume(side: _Side, child_id: str) -> float:
    t0 = time.perf_counter()
    sent = side.control.send_message(side.parent, child_id, [TextBlock(text="again")])
    called, run, _request = side.provider.wait_resumed(child_id)
    run.release()
    side.wait(sent.task_id)
    return called - t0


def _queued(side: _Side, idle_child: str | None) -> float:
    """One queued admission: a holder runs, the measured Task waits; the holder ends."""
    holder_child, holder_task = side.start("holder")
    side.provider.wait_started(holder_child)
    if idle_child is None:
        child_id, task_id = side.start("queued")
    else:
        sent = side.control.send_message(side.parent, idle_child, [TextBlock(text="queued")])
        child_id, task_id = idle_child, sent.task_id
    side.wait_queued(task_id)
    side.provider.runs[holder_child].release()
    freed = side.settled_at(holder_task)
    if idle_child is None:
        called = side.provider.wait_started(child_id)
    else:
        called, _run, _request = side.provider.wait_resumed(child_id)
    side.provider.runs[child_id].release()
    side.control.tasks.wait(holder_task, timeout=_WAIT_S, requester=side.parent)
    side.wait(task_id)
    return called - freed


def _body(config: AdmissionConfig, rows: dict[str, dict[str, Spread]], skipped: str | bool) -> str:
    lines = [
        "A queued activation's admission once a slot frees, against a plain resume "
        f"(goal: ≤ {_GOAL:g}×, ratio inside each run). Limit `{{'bench': 1}}`; the clock "
        "starts when the holder's Task has settled (its `on_done`, after the store took the "
        "settlement) and stops when the provider is called for the queued child; the plain "
        "resume runs from `send_message` to the provider's `resume` under no limit. "
        f"{config.rounds} runs × {config.samples} samples of each, alternating.",
        "",
    ]
    table_rows = []
    for backend, figures in rows.items():
        for name, label in (("start", "queued start"), ("resume", "queued resume")):
            ratio = figures[f"{name}_ratio"]
            verdict = "meets" if ratio.median <= _GOAL else "**misses**"
            table_rows.append(
                (
                    backend,
                    label,
                    fmt_s(figures[name]),
                    fmt_s(figures["plain"]),
                    f"{fmt_ratio(ratio)} — {verdict}",
                )
            )
    lines.append(
        table(
            ("backend", "admission of a", "when a slot frees", "plain resume", "ratio"), table_rows
        )
    )
    if skipped:
        lines += ["", f"PostgreSQL: {skipped}."]
    return "\n".join(lines)
