"""Hand-offs per steer and per resume, counted; and where a short cold resume's time goes.

In one process, on a SQLite store opened inside `benchmarks._counting.counting` (so every
connection is traced and every pykka message counted):

- a steer into a running child (``send_message`` → ``steered``);
- a warm resume of an idle 10-message child (supervisor up): ``send_message`` until its
  Task settled, the run released as soon as ``provider.resume`` was called;
- a cold resume of a 100-message child on a freshly opened control plane, the same way
  (the plane's opening and closing are not counted: the sweep that registering its
  provider starts on the runtime's thread is waited for before counting);
- a whole scripted turn: ``send_message`` to an idle child on an instant `ScriptedModel`
  (`InProcessProvider`) until its Task completed — with its CPU time and wall time per
  turn beside the counts.

The benchmark provider writes nothing and calls no actor, so every count is outside the
provider. The figures are per operation, averaged over many; a lease renewal that falls
inside the window is counted too (a fraction per operation, named in the breakdown).

The cold resume's timeline — when each message was sent, each store call began and
returned, and each transaction began and committed, from ``send_message`` to
``provider.resume`` — is the median over the runs of each step's offset; the gaps between
steps say where the time goes.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._counting import Counts, counting
from benchmarks._harness import seed_child, sqlite_url
from benchmarks._report import Section, table
from benchmarks._routes import Plane
from controlplane import TextBlock
from persistence import SqlStore

__all__ = ["HopsConfig", "run_hops"]

COLD_LENGTH = 100
SCRIPTED_TURN = "scripted turn (start → completed)"
timing: dict[str, tuple[float, float]] = {}
"""The last count's CPU and wall p50 per scripted turn (seconds)."""
turn_steps: list[Step] = []
"""The last count's median timeline of a scripted turn, ``send_message`` → Task completed."""


class _ScriptedTurns:
    """Turns of one idle child on an instant `ScriptedModel`, each until its Task completed."""

    def __init__(self, plane: Plane, counts: Counts) -> None:
        from controlplane import ContinuableStartSpec, InProcessProvider, ScriptedModel

        self._plane = plane
        self._counts = counts
        self.timelines: list[list[tuple[float, str]]] = []
        plane.control.providers.register(InProcessProvider(ScriptedModel(["done"])))
        spec = ContinuableStartSpec(
            provider="inprocess", label="turns", prompt=[TextBlock(text="go")],
            parent=plane.parent,
        )  # fmt: skip
        started = plane.control.start_continuable(spec)
        self._wait(started.task_id)
        self._child = started.child_id
        self._cpu = 0.0
        self._walls: list[float] = []

    def turn(self) -> None:
        before = self._counts.snapshot()
        cpu, t0 = time.process_time(), time.perf_counter()
        sent = self._plane.control.send_message(
            self._plane.parent, self._child, [TextBlock(text="next")], None
        )
        self._wait(sent.task_id)
        ended = time.perf_counter()
        self._walls.append(ended - t0)
        self._cpu += time.process_time() - cpu
        run = self._counts.since(before)
        self.timelines.append(
            [(0.0, "send_message")]
            + [(t - t0, what) for t, what in sorted(run.timeline)]
            + [(ended - t0, "tasks.wait returned completed")]
        )

    def timing(self) -> tuple[float, float]:
        return self._cpu / len(self._walls), statistics.median(self._walls)

    def _wait(self, task_id: str) -> None:
        from controlplane import TaskStatus

        control, parent = self._plane.control, self._plane.parent
        done = control.tasks.wait(task_id, timeout=60.0, requester=parent)
        if done.status is not TaskStatus.COMPLETED:
            raise AssertionError(f"a scripted turn ended {done.status}")


@dataclass(frozen=True)
class HopsConfig:
    """How many operations to count."""

    steers: int = 200
    resumes: int = 40
    cold_resumes: int = 15

    @classmethod
    def quick(cls) -> HopsConfig:
        """A smoke run."""
        return cls(steers=20, resumes=4, cold_resumes=3)


@dataclass(frozen=True)
class Tally:
    """One kind of operation's counts, per operation."""

    name: str
    ops: int
    counts: Counts

    def per(self, value: int) -> str:
        return f"{value / self.ops:.2f}".rstrip("0").rstrip(".")


def count_operations(config: HopsConfig, workdir: Path) -> tuple[list[Tally], list[Step]]:
    """The tallies of steers, warm resumes and cold resumes; the cold resume's timeline."""
    url = sqlite_url(workdir / "hops.db")
    with SqlStore(url) as store:
        idle = seed_child(store, 10)
        cold = seed_child(store, COLD_LENGTH)
    tallies: list[Tally] = []
    timing.clear()
    turn_steps.clear()
    with counting() as counts:
        plane = Plane.open(url)
        try:
            live: list[str] = []
            plane.grow(live, 1)
            plane.resume(idle)  # warm: the idle child's supervisor is up from here on
            tallies.append(_tally("steer", counts, config.steers, lambda: plane.steer(live[0])))
            tallies.append(
                _tally(
                    "warm resume (to settled)", counts, config.resumes, lambda: plane.resume(idle)
                )
            )
            turns = _ScriptedTurns(plane, counts)
            tallies.append(_tally(SCRIPTED_TURN, counts, config.resumes, turns.turn))
            timing[SCRIPTED_TURN] = turns.timing()
            turn_steps[:] = _median_timeline(turns.timelines)
        finally:
            plane.close()
        cold_counts: list[Counts] = []
        timelines: list[list[tuple[float, str]]] = []
        for _ in range(config.cold_resumes):
            opened = counts.snapshot()
            plane = Plane.open(url)
            try:
                _opening_swept(counts, opened)
                before = counts.snapshot()
                t0 = time.perf_counter()
                resumed = plane.resume(cold, [TextBlock(text="continue")], source=None)
                run = counts.since(before)
                cold_counts.append(run)
                called = t0 + resumed.to_provider_s
                timelines.append(
                    [(0.0, "send_message")]
                    + [(t - t0, what) for t, what in sorted(run.timeline) if t <= called]
                    + [(called - t0, "provider.resume called")]
                )
            finally:
                plane.close()
    total = Counts()
    for run in cold_counts:
        total.messages += run.messages
        total.transactions += _own(run).transactions
        total.statements += run.statements
    tallies.append(
        Tally(f"cold resume, {COLD_LENGTH} messages (to settled)", len(cold_counts), total)
    )
    return tallies, _median_timeline(timelines)


_SWEPT = "read: runtimes, tasks"
"""The last read of a runtime's sweep when no runtime is dead (`persistence._ledger`'s
``suspects``)."""
_SWEEP_WAIT_S = 10.0


def _opening_swept(counts: Counts, opened: Counts) -> None:
    """Wait until the sweep that registering the plane's provider starts on the runtime's
    own thread (Tasks waiting for that provider, then dead runtimes) has read, so that the
    opening's reads are not counted as the cold resume's: they are not on its path, and
    landed inside it or not by the scheduler's whim. Bounded: a sweep that reads
    something else is waited for `_SWEEP_WAIT_S`, then counted with the resume."""
    deadline = time.monotonic() + _SWEEP_WAIT_S
    while time.monotonic() < deadline:
        if counts.since(opened).swept[_SWEPT]:
            return
        time.sleep(0.001)


def _tally(name: str, counts: Counts, ops: int, op: Callable[[], object]) -> Tally:
    before = counts.snapshot()
    for _ in range(ops):
        op()
    return Tally(name, ops, _own(counts.since(before)))


def _own(counts: Counts) -> Counts:
    """``counts`` without the transactions the runtime's housekeeping threads ran inside
    the window (lease renewals, sweeps, the wake-up poll): not the operation's, and in it
    or not as the scheduler has it."""
    counts.transactions -= counts.swept
    return counts


@dataclass(frozen=True)
class Step:
    """One step of the cold resume's timeline: its median offset and the gap before it."""

    what: str
    at_s: float
    gap_s: float


def _median_timeline(timelines: Sequence[list[tuple[float, str]]]) -> list[Step]:
    """Steps matched across runs by what they are and their occurrence, in median order;
    a step missing from some runs (a lease renewal) is left out."""
    keyed: dict[tuple[str, int], list[float]] = {}
    for timeline in timelines:
        seen: Counter[str] = Counter()
        for at, what in timeline:
            seen[what] += 1
            keyed.setdefault((what, seen[what]), []).append(at)
    common = {k: statistics.median(v) for k, v in keyed.items() if len(v) == len(timelines)}
    ordered = sorted(common.items(), key=lambda item: item[1])
    steps, previous = [], 0.0
    for (what, nth), at in ordered:
        steps.append(Step(what if nth == 1 else f"{what} (#{nth})", at, at - previous))
        previous = at
    return steps


def run_hops(config: HopsConfig, workdir: Path) -> Section:
    """Count, and return the report section."""
    tallies, steps = count_operations(config, workdir)
    figures: dict[str, float] = {}  # for `--against` (benchmarks._against)
    for t in tallies:
        figures[f"actor messages per {t.name}"] = (t.counts.tells + t.counts.asks) / t.ops
        figures[f"cross-thread hops per {t.name}"] = t.counts.hops / t.ops
        figures[f"store transactions per {t.name}"] = t.counts.total_transactions / t.ops
        figures[f"write transactions per {t.name}"] = t.counts.writes / t.ops
    for name, (cpu, wall) in timing.items():
        figures[f"CPU s per {name}"] = cpu
        figures[f"wall p50 s of {name}"] = wall
    if steps:
        figures[f"cold resume to provider.resume, {COLD_LENGTH} messages, counted run"] = steps[
            -1
        ].at_s
    return Section("Hops and transactions", _body(config, tallies, steps), {"figures": figures})


def _body(config: HopsConfig, tallies: list[Tally], steps: list[Step]) -> str:
    rows = [
        [
            t.name,
            t.per(t.counts.tells + t.counts.asks),
            f"{t.per(t.counts.tells)} / {t.per(t.counts.asks)}",
            t.per(t.counts.hops),
            t.per(t.counts.total_transactions),
            t.per(t.counts.writes),
            t.per(t.counts.statements),
        ]
        for t in tallies
    ]
    header = [
        "operation",
        "actor messages",
        "tell / ask",
        "cross-thread hops",
        "store transactions",
        "of which write",
        "SQL statements",
    ]
    breakdown = []
    for t in tallies:
        items = [*t.counts.messages.items(), *t.counts.transactions.items()]
        parts = [f"`{label}` × {t.per(n)}" for label, n in sorted(items)]
        if t.name in timing:
            cpu, wall = timing[t.name]
            parts.append(
                f"CPU {cpu * 1e3:.2f} ms per turn (all threads), wall p50 {wall * 1e3:.2f} ms "
                "(counters on; goal ≤ 1.5 ms p50 on SQLite)"
            )
        breakdown.append(f"- **{t.name}**: " + "; ".join(parts))
    timeline = [
        [f"{step.at_s * 1e6:,.0f} µs", f"+{step.gap_s * 1e6:,.0f} µs", f"`{step.what}`"]
        for step in steps
    ]
    return f"""\
Counted, not estimated (`benchmarks/hops.py`, `benchmarks/_counting.py`): pykka
`ActorRef.tell`/`ask` wrapped in the benchmark process (proxy calls included; an `ask` is
two cross-thread hops, its reply being the second) and every SQLite statement traced on the
store's connections, grouped into transactions (`BEGIN` … `COMMIT`, or one statement on
its own, which SQLite runs as its own transaction). Per operation, averaged over
{config.steers} steers, {config.resumes} warm resumes and {config.cold_resumes} cold
resumes; the benchmark provider writes nothing, so all of it is outside the provider.
A resume is counted from `send_message` until its Task settled (the run released at once).
Hand-offs that are not pykka messages (events, queues) are not counted.

{table(header, rows)}

What they are (per operation):

{chr(10).join(breakdown)}

**Where a cold resume of a {COLD_LENGTH}-message child spends its time** — the median
offset from `send_message` of each actor message sent, each store call's start and return
and each transaction's `BEGIN` and `COMMIT` (the statement's start), up to
`provider.resume`, over {config.cold_resumes} runs with the counters on (they add about a
microsecond per step); the gap is the time since the step before it, so a gap ending in
`return store.load` is the load's own work (its rows fetched and decoded) and one ending
in a message is the code that ran before sending it:

{table(["at", "gap", "step"], timeline)}

**Where a whole scripted turn spends its time** — the same, for the {config.resumes}
scripted turns above (an idle child on an instant `ScriptedModel`, `send_message` until
`tasks.wait` returns it completed; the model call itself costs nothing, and its
`InProcessProvider` runs the agent loop on a thread of its own):

{table(["at", "gap", "step"], _rows_of(turn_steps))}
"""


def _rows_of(steps: list[Step]) -> list[list[str]]:
    return [
        [f"{step.at_s * 1e6:,.0f} µs", f"+{step.gap_s * 1e6:,.0f} µs", f"`{step.what}`"]
        for step in steps
    ]
