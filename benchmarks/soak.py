"""Idle children and a soak: what a child costs between its turns, and whether a long run
under churn levels off.

Both run in a fresh interpreter (``python -m benchmarks.soak MODE …``, started by
`run_soak`), on a SQLite file store, every turn a whole one on an instant `ScriptedModel`
(``send_message`` → the Task completed):

- ``idle COUNT``: ``COUNT`` children each run their first turn and go idle, their
  supervisors all kept (the early-retirement cap lifted above ``COUNT`` for this one
  measurement); threads and VmRSS before and after, so bytes and threads per idle child
  (each count taken once every loop has parked and the pool's idle workers, shared by all
  actors, have ended).
- ``soak TURNS``: the default options, two threads running turns with steady churn (half
  the turns start a new child, half resume one of the thread's latest few); every
  ``TURNS / 40`` turns, VmRSS, threads, objects the garbage collector tracks and the
  supervisors kept. RSS is "flat" when no later sample exceeds the one at the end of the
  warm-up (the first quarter of the turns) by more than 10%.
"""

from __future__ import annotations

import gc
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import PARENT_SESSION, proc_status, sqlite_url
from benchmarks._probe import run_probe
from benchmarks._report import Section, table
from benchmarks._stats import fmt_count, fmt_kib, fmt_mib, spread

__all__ = ["SoakConfig", "run_soak"]

_WARM_UP = 0.25
"""The share of the soak's turns after which RSS must stay within `_FLAT` of its level."""
_FLAT = 1.10
_SAMPLES = 40
_RECENT = 8
"""How many of its latest children a soak thread resumes from."""
_THREADS = 2
_WAIT_S = 60.0
_PROBE_TIMEOUT_S = 1800


@dataclass(frozen=True)
class SoakConfig:
    """How much to measure."""

    idle: int = 10_000
    idle_runs: int = 1
    turns: int = 20_000

    @classmethod
    def quick(cls) -> SoakConfig:
        """A smoke run: small, seconds."""
        return cls(idle=200, idle_runs=1, turns=400)


def run_soak(config: SoakConfig, workdir: Path) -> Section:
    """Measure idle children and a soak, each in a fresh process; the report section."""
    idle = [
        run_probe_module("idle", sqlite_url(workdir / f"idle-{run}.db"), str(config.idle))
        for run in range(config.idle_runs)
    ]
    soak = run_probe_module("soak", sqlite_url(workdir / "soak.db"), str(config.turns))
    return _section(config, idle, soak)


def run_probe_module(*args: str) -> dict[str, Any]:
    """One of this module's probes in a fresh interpreter; its JSON result."""
    return run_probe(*args, module="benchmarks.soak", timeout_s=_PROBE_TIMEOUT_S)


# -- the probes, in their own process ------------------------------------------------------


class _Turns:
    """A control plane on an instant scripted model, and whole turns on it."""

    def __init__(self, url: str) -> None:
        from controlplane import InProcessProvider, ScriptedModel, SubagentControl

        self.control = SubagentControl.open(url)
        self.control.providers.register(InProcessProvider(ScriptedModel(["done"])))
        self.parent = self.control.agents.register(PARENT_SESSION)

    def start(self) -> str:
        """A new child, once its first turn has completed."""
        from controlplane import ContinuableStartSpec, TextBlock

        spec = ContinuableStartSpec(
            provider="inprocess", label="soak", prompt=[TextBlock(text="go")], parent=self.parent
        )
        started = self.control.start_continuable(spec)
        self._settled(started.task_id)
        return started.child_id

    def resume(self, child_id: str) -> None:
        """One more whole turn of an idle child."""
        from controlplane import TextBlock

        sent = self.control.send_message(self.parent, child_id, [TextBlock(text="next")])
        self._settled(sent.task_id)

    def _settled(self, task_id: str) -> None:
        from controlplane import TaskStatus

        done = self.control.tasks.wait(task_id, timeout=_WAIT_S, requester=self.parent)
        if done.status is not TaskStatus.COMPLETED:
            raise AssertionError(f"a turn ended {done.status}")

    def quiet(self) -> None:
        """Wait until no actor loop holds a worker (every supervisor parked), then end the
        idle workers of the actors' pool and of the agent loops' pool (shared by the
        process, each at most its ``max_idle``; how many are idle at a moment depends on
        whether a turn's loop thread was back before the next turn asked for one): the
        threads left are those something holds."""
        from actors._pool import actor_threads
        from controlplane.providers._loop_threads import IDLE_NAME, loop_threads

        _wait_until(lambda: not _named("ChildSupervisor-", "ActivationActor-"), "loops parked")
        actor_threads.drain()
        loop_threads.drain()
        _wait_until(lambda: not _named("actor-pool-idle", IDLE_NAME), "idle workers ended")

    def supervisors(self) -> int:
        return len(self.control._routes)


def _named(*prefixes: str) -> bool:
    return any(t.name.startswith(prefixes) for t in threading.enumerate())


def _wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    pause = threading.Event()
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        pause.wait(0.01)


def _snapshot() -> dict[str, int]:
    gc.collect()
    return {**proc_status(), "objects": len(gc.get_objects())}


def _idle(url: str, count: int) -> dict[str, Any]:
    import actors.root

    actors.root.IDLE_SUPERVISOR_CAP = count + 100  # every idle supervisor kept
    turns = _Turns(url)
    try:
        for _ in range(20):  # warm: imports, caches, the pool's workers
            turns.start()
        turns.quiet()
        before = _snapshot()
        t0 = time.perf_counter()
        for _ in range(count):
            turns.start()
        took = time.perf_counter() - t0
        turns.quiet()
        after = _snapshot()
        kept = turns.supervisors()
    finally:
        turns.control.close()
    return {"before": before, "after": after, "count": count, "kept": kept, "took_s": took}


def _soak(url: str, total: int) -> dict[str, Any]:
    turns = _Turns(url)
    every = max(1, total // _SAMPLES)
    done = 0
    lock = threading.Lock()
    samples: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    started = time.perf_counter()

    def work(seed: int, share: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        recent: list[str] = []
        try:
            for _ in range(share):
                if not recent or rng.random() < 0.5:
                    recent = [*recent[-(_RECENT - 1) :], turns.start()]
                else:
                    turns.resume(rng.choice(recent))
                with lock:
                    done += 1
                    due = done % every == 0
                    if due:
                        samples.append(
                            {
                                "turns": done,
                                "s": time.perf_counter() - started,
                                "supervisors": turns.supervisors(),
                                **_snapshot(),
                            }
                        )
        except BaseException as exc:
            errors.append(exc)

    try:
        workers = [
            threading.Thread(target=work, args=(i, total // _THREADS)) for i in range(_THREADS)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        turns.control.close()
    if errors:
        raise errors[0]
    return {"samples": samples, "turns": done, "took_s": time.perf_counter() - started}


def main(argv: list[str]) -> int:
    """Run one probe and print its JSON result."""
    mode, url, count = argv
    if mode == "idle":
        out = _idle(url, int(count))
    elif mode == "soak":
        out = _soak(url, int(count))
    else:
        raise SystemExit(f"unknown probe {mode!r}")
    print(json.dumps(out))
    return 0


# -- the section ---------------------------------------------------------------------------


def _section(config: SoakConfig, idle: list[dict[str, Any]], soak: dict[str, Any]) -> Section:
    n = config.idle
    per_rss = spread([(r["after"]["rss"] - r["before"]["rss"]) / n for r in idle])
    per_threads = spread([(r["after"]["threads"] - r["before"]["threads"]) / n for r in idle])
    per_objects = spread([(r["after"]["objects"] - r["before"]["objects"]) / n for r in idle])
    idle_rows = [
        [
            "before (20 idle children, warm)",
            fmt_count(spread([r["before"]["threads"] for r in idle])),
            fmt_mib(spread([r["before"]["rss"] for r in idle])),
            fmt_count(spread([r["before"]["objects"] for r in idle])),
        ],
        [
            f"{n:,} more idle children ({fmt_count(spread([r['kept'] for r in idle]))} "
            "supervisors kept)",
            fmt_count(spread([r["after"]["threads"] for r in idle])),
            fmt_mib(spread([r["after"]["rss"] for r in idle])),
            fmt_count(spread([r["after"]["objects"] for r in idle])),
        ],
        [
            "per idle child",
            f"{per_threads.median:.3f}",
            fmt_kib(per_rss),
            f"{per_objects.median:.1f}",
        ],
    ]
    idle_met = per_rss.median <= 16 * 1024 and per_threads.median <= 0
    samples = soak["samples"]
    warm_at = next(
        (i for i, s in enumerate(samples) if s["turns"] >= _WARM_UP * soak["turns"]),
        len(samples) - 1,
    )
    warm = samples[warm_at]
    later = samples[warm_at:]
    peak = max(s["rss"] for s in later)
    growth = peak / warm["rss"]
    flat = growth <= _FLAT
    shown = samples[:: max(1, len(samples) // 10)]
    if samples and shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    soak_rows = [
        [
            f"{s['turns']:,}",
            f"{s['s']:.0f} s",
            f"{s['rss'] / 1024 / 1024:.1f} MiB",
            f"{s['threads']}",
            f"{s['objects']:,}",
            f"{s['supervisors']:,}",
        ]
        for s in shown
    ]
    rate = soak["turns"] / soak["took_s"]
    body = f"""\
A fresh interpreter for each measurement, SQLite store (file, WAL), every turn a whole one on
an instant `ScriptedModel` (`send_message` → Task completed). An idle child's supervisor
holds no thread: its actor loop runs on a pooled worker only while its mailbox has messages
(`actors._parking`), and between turns it is a few objects in the routing table.

**{n:,} idle children in one process** ({config.idle_runs} run(s); each child ran one turn;
the early-retirement cap lifted above {n:,} for this measurement, so every supervisor is
kept; counted once every actor loop had given its worker back and the pool's idle workers
— at most 16, shared by every actor — had ended):

{table(["", "threads", "VmRSS", "gc-tracked objects"], idle_rows)}

Goal: ≤ 16 KiB and 0 threads per idle child — {_met(idle_met)}.

**Soak** — {soak["turns"]:,} turns with the default options ({_THREADS} threads, half the
turns start a new child, half resume one of the thread's {_RECENT} latest;
{rate:,.0f} turns/s), sampled every {max(1, config.turns // _SAMPLES):,} turns (every
tenth sample shown, and the last):

{table(["turns", "elapsed", "VmRSS", "threads", "gc-tracked objects", "supervisors"], soak_rows)}

RSS at the end of the warm-up ({warm["turns"]:,} turns): {warm["rss"] / 1024 / 1024:.1f} MiB;
highest after it: {peak / 1024 / 1024:.1f} MiB ({growth:.2f}×). Goal: flat within 10% after
the warm-up — {_met(flat)}.
"""
    return Section(
        "Idle children and soak",
        body,
        {
            "per_idle_rss": per_rss.median,
            "per_idle_threads": per_threads.median,
            "growth": growth,
            "figures": {  # for `--against` and the goals (benchmarks._goals)
                "KiB per idle child": per_rss.median / 1024,
                "threads per idle child": per_threads.median,
                "idle children measured": float(n),
                "soak turns": float(soak["turns"]),
                "soak RSS highest after warm-up / at warm-up": growth,
                "soak RSS at warm-up MiB": warm["rss"] / 1024 / 1024,
            },
        },
    )


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
