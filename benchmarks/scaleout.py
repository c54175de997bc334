"""Scale-out: 1, 2 and 4 runtime processes on one PostgreSQL (issue 39).

Each level runs in a database of its own, created for it and dropped after. Each runtime
(`benchmarks._scaleout_worker`, an OS process) has its own children: held runs to steer,
and idle children on an instant `ScriptedModel`, each send to which runs a whole turn.
Every runtime runs the same phase at once, on a few closed-loop threads, for a fixed time:

- ``turns``: a send to an idle child of its own until its Task completed;
- ``local`` steers: into a held child of its own;
- ``forwarded`` steers (2+ runtimes): into the held children of the next runtime, through
  the database (inbox row, NOTIFY, the holder's steer and answer).

Per phase: aggregate operations per second, p50/p99 latency, and per operation the
database's commits (``pg_stat_database.xact_commit`` of the level's database, read after
the backends flushed their counters), WAL bytes (``pg_current_wal_lsn``; the server is
shared, so the background WAL rate, measured over a quiet second just before, is taken
off), CPU seconds in the runtimes (their processes' own) and in PostgreSQL (the backends
serving the level's database, from ``/proc``; the WAL writer and checkpointer are not
counted). From PostgreSQL's CPU per turn: the projected ceiling of one 96-vCPU server, if
its CPU were the only limit, beside DBOS's published figures for such a server.

On this 2-vCPU VM the runtimes and PostgreSQL share the two cores (and other users' load):
the aggregate rates are bounded by that, not by the design; the per-operation costs are
what carries over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._report import Section, table
from benchmarks._stats import percentile

__all__ = ["TITLE", "ScaleoutConfig", "run_scaleout"]

TITLE = "Scale-out on one PostgreSQL"
DBOS_WORKFLOWS_PER_S = 43_000
"""DBOS's published workflows/s (two writes each) on one 96-vCPU PostgreSQL server."""
DBOS_QUEUED_PER_S = 12_100
"""DBOS's published queued workflows/s on the same server."""
SERVER_VCPUS = 96
_PHASES = ("turns", "local", "forwarded")
_PHASE_NAMES = {"turns": "turns", "local": "local steers", "forwarded": "forwarded steers"}
_THIS = Path(__file__).resolve().parents[1]
_READY_S = 180.0
_FLUSH_S = 1.5  # backends flush their statistics within a second of going idle


@dataclass(frozen=True)
class ScaleoutConfig:
    """How much to measure."""

    levels: tuple[int, ...] = (1, 2, 4)
    seconds: float = 4.0
    held: int = 4
    idle: int = 8
    threads: int = 2

    @classmethod
    def quick(cls) -> ScaleoutConfig:
        """A smoke run: seconds, not citable."""
        return cls(levels=(1, 2), seconds=1.0, held=2, idle=2, threads=1)


@dataclass(frozen=True)
class PhaseResult:
    """One phase at one level, summed over its runtimes."""

    runtimes: int
    phase: str
    ops: int
    per_s: float
    p50_s: float
    p99_s: float
    commits: float
    wal_bytes: float
    runtime_cpu_s: float
    pg_cpu_s: float

    def per_op(self, total: float) -> float:
        return total / self.ops if self.ops else float("nan")


def run_scaleout(config: ScaleoutConfig, pg_url: str | None, pg_note: str) -> Section:
    """Measure each level in its own database of the PostgreSQL at ``pg_url``."""
    if pg_url is None:
        return Section(TITLE, f"PostgreSQL was skipped: {pg_note}.", {"skipped": True})
    results: list[PhaseResult] = []
    for level in config.levels:
        with _database(pg_url) as (url, name):
            results += _measure_level(config, pg_url, url, name, level)
    return _section(config, results)


# -- one level ----------------------------------------------------------------------------


def _measure_level(
    config: ScaleoutConfig, base_url: str, url: str, name: str, level: int
) -> list[PhaseResult]:
    import psycopg

    workers = [_Worker(url, config) for _ in range(level)]
    try:
        for worker in workers:
            worker.wait_ready()
        found: list[PhaseResult] = []
        with psycopg.connect(_libpq(base_url), autocommit=True) as stats:
            for phase in _PHASES:
                if phase == "forwarded" and level < 2:
                    continue
                background = _wal_rate(stats)
                time.sleep(_FLUSH_S)
                before = _snapshot(stats, name)
                for i, worker in enumerate(workers):
                    target = workers[(i + 1) % level].held
                    worker.send({"phase": phase, "seconds": config.seconds, "targets": target})
                done = [worker.done() for worker in workers]
                time.sleep(_FLUSH_S)
                after = _snapshot(stats, name)
                found.append(_result(level, phase, done, before, after, background))
        return found
    finally:
        for worker in workers:
            worker.stop()


class _Worker:
    """One runtime process, its children set up; phases are sent one line each."""

    def __init__(self, url: str, config: ScaleoutConfig) -> None:
        import persistence

        tree = Path(persistence.__file__).resolve().parents[1]  # the packages measured
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys(filter(None, [str(tree), str(_THIS), env.get("PYTHONPATH")]))
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(_THIS / "benchmarks" / "_scaleout_worker.py"), url,
             str(config.held), str(config.idle), str(config.threads)],
            cwd=_THIS,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.held: list[str] = []
        self._lines: list[str] = []
        self._got = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._got:
                self._lines.append(line)
                self._got.notify_all()
        with self._got:
            self._lines.append("EOF")
            self._got.notify_all()

    def _next(self, prefix: str, timeout_s: float) -> dict[str, Any]:
        with self._got:
            deadline = time.monotonic() + timeout_s
            while True:
                while self._lines:
                    line = self._lines.pop(0)
                    if line == "EOF":
                        raise RuntimeError(f"a scale-out runtime exited ({self.proc.poll()})")
                    if line.startswith(prefix + " "):
                        value: dict[str, Any] = json.loads(line.removeprefix(prefix + " "))
                        return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"a scale-out runtime sent no {prefix}")
                self._got.wait(left)

    def wait_ready(self) -> None:
        self.held = list(self._next("READY", _READY_S)["held"])

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def done(self) -> dict[str, Any]:
        result = self._next("DONE", _READY_S)
        if result["errors"]:
            raise RuntimeError(f"a scale-out runtime failed: {result['errors'][:3]}")
        return result

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


# -- what the server says -------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    at: float
    commits: int
    lsn: int
    backend_cpu_s: dict[int, float]


def _snapshot(stats: Any, name: str) -> _Snapshot:
    row = stats.execute(
        "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn "
        "FROM pg_stat_database WHERE datname = %s",
        (name,),
    ).fetchone()
    pids = [
        r[0] for r in stats.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))
    ]
    return _Snapshot(time.monotonic(), int(row[0]), int(row[1]), {p: _cpu_of(p) for p in pids})


def _wal_rate(stats: Any) -> float:
    """WAL bytes per second the rest of the server writes meanwhile (a quiet second)."""
    first = int(stats.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    t0 = time.monotonic()
    time.sleep(1.0)
    last = int(stats.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    return (last - first) / (time.monotonic() - t0)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    """A process's user + system CPU seconds (0 when it is gone or unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _result(
    level: int,
    phase: str,
    done: list[dict[str, Any]],
    before: _Snapshot,
    after: _Snapshot,
    background: float,
) -> PhaseResult:
    latencies = sorted(s for d in done for s in d["latencies"])
    ops = sum(int(d["ops"]) for d in done)
    wall = max(float(d["wall_s"]) for d in done)
    pg_cpu = sum(
        max(0.0, cpu - before.backend_cpu_s.get(pid, 0.0))
        for pid, cpu in after.backend_cpu_s.items()
    )
    wal = (after.lsn - before.lsn) - background * (after.at - before.at)
    return PhaseResult(
        runtimes=level,
        phase=phase,
        ops=ops,
        per_s=ops / wall,
        p50_s=percentile(latencies, 50),
        p99_s=percentile(latencies, 99),
        commits=float(after.commits - before.commits),
        wal_bytes=max(0.0, wal),
        runtime_cpu_s=sum(float(d["cpu_s"]) for d in done),
        pg_cpu_s=pg_cpu,
    )


@contextmanager
def _database(base_url: str) -> Iterator[tuple[str, str]]:
    """A fresh database on the server of ``base_url``, dropped afterwards."""
    import psycopg

    name = f"bench_scaleout_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    head, _, tail = base_url.partition("?")
    url = head.rsplit("/", 1)[0] + "/" + name + ("?" + tail if tail else "")
    try:
        yield url, name
    finally:
        with psycopg.connect(_libpq(base_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# -- the report -------------------------------------------------------------------------------


def _section(config: ScaleoutConfig, results: list[PhaseResult]) -> Section:
    rows = []
    figures: dict[str, float] = {}
    for r in results:
        name = _PHASE_NAMES[r.phase]
        rows.append([
            str(r.runtimes), name, f"{r.per_s:,.0f}", _ms(r.p50_s), _ms(r.p99_s),
            f"{r.per_op(r.commits):.2f}", f"{r.per_op(r.wal_bytes):,.0f}",
            _ms(r.per_op(r.runtime_cpu_s)), _ms(r.per_op(r.pg_cpu_s)),
        ])  # fmt: skip
        figures[f"{name} per s, {r.runtimes} runtime(s)"] = r.per_s
        figures[f"{name} p50 s, {r.runtimes} runtime(s)"] = r.p50_s
    body = [
        f"Each level in a database of its own; every runtime an OS process with "
        f"{config.held} held children (steer targets) and {config.idle} idle children on an "
        f"instant `ScriptedModel`, running each phase on {config.threads} closed-loop "
        f"threads for {config.seconds:g} s, all runtimes at once. Commits are the level's "
        "database's (`pg_stat_database`); WAL bytes are the server's less its background "
        "rate of the quiet second before; PostgreSQL CPU is the backends serving the "
        "database (`/proc`), not the WAL writer. The runtimes and the server share this "
        "VM's two vCPUs: aggregate rates are bounded by that.",
        "",
        table(_COLUMNS, rows),
    ]
    body += ["", _projection(results, figures), "", _PLOT]
    return Section(TITLE, "\n".join(body), {"figures": figures, "results": results})


_PLOT = "![Scale-out: aggregate operations per second against runtime processes](scaleout.png)"

_COLUMNS = (
    "runtimes", "operation", "aggregate /s", "p50", "p99", "commits / op", "WAL bytes / op",
    "runtime CPU / op", "PostgreSQL CPU / op",
)  # fmt: skip


def _projection(results: list[PhaseResult], figures: dict[str, float]) -> str:
    """The ceiling of one 96-vCPU PostgreSQL from its CPU per operation at the top level."""
    top = max(r.runtimes for r in results)
    lines = [
        f"**Projected ceiling of one {SERVER_VCPUS}-vCPU PostgreSQL** (from the server's CPU "
        f"per operation at {top} runtime(s), if its CPU were the only limit: "
        f"{SERVER_VCPUS} / CPU per operation; lock waits, WAL bandwidth and the network "
        "are not in it):",
        "",
    ]
    rows = []
    for r in results:
        if r.runtimes != top or not r.pg_cpu_s:
            continue
        ceiling = SERVER_VCPUS / r.per_op(r.pg_cpu_s)
        name = _PHASE_NAMES[r.phase]
        figures[f"projected {name} per s, {SERVER_VCPUS} vCPUs"] = ceiling
        against = (
            f"{ceiling / DBOS_WORKFLOWS_PER_S:.2f}× DBOS's {DBOS_WORKFLOWS_PER_S:,} workflows/s, "
            f"{ceiling / DBOS_QUEUED_PER_S:.2f}× its {DBOS_QUEUED_PER_S:,} queued/s"
        )
        rows.append([name, f"{ceiling:,.0f}/s", f"{r.per_op(r.commits):.2f}", against])
    lines.append(table(["operation", "projected /s", "commits / op", "against DBOS"], rows))
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    if seconds != seconds:  # NaN: nothing measured
        return "–"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.2f} ms"


def plot_scaleout(results: list[PhaseResult], path: Path, *, title_note: str) -> None:
    """Write the curve (aggregate operations per second against runtimes) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for phase, marker in zip(_PHASES, ("o", "s", "^"), strict=True):
        points = sorted((r.runtimes, r.per_s) for r in results if r.phase == phase)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=marker, label=_PHASE_NAMES[phase])
    ax.set_xlabel("runtime processes on one PostgreSQL")
    ax.set_ylabel("aggregate operations / s")
    ax.set_xticks(sorted({r.runtimes for r in results}))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"Scale-out, 2 vCPUs shared by runtimes and server ({title_note})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
