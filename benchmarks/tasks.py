"""Durable Tasks (issue 14, SPEC §9): what keeping every Task in the store costs.

- Route cost: the resume route (``send_message`` to an idle child → ``provider.resume``)
  and the steer, on a control plane that keeps Task rows against one that does not, in the
  same process, interleaved. The baseline is today's `SubagentControl` whose Task service
  has its ledger taken away before any Task starts (`_task_routes.without_task_rows`); it
  still claims a resume's child, which SPEC §9 needs with or without Task rows. A third
  plane claims nothing either: the route before SPEC §9, for the record. Goals: resume
  ≤ +10%, steer unchanged within noise.
- Readiness: `SubagentControl.open` and the first send, in a fresh interpreter, on a store
  holding 1,000 vs 1,000,000 settled Tasks (`benchmarks._task_rows`). Goal: flat.
- Read: `tasks.get` of a stored Task this runtime does not hold, against one raw
  ``sqlite3`` primary-key select of the same row on the same file. Goal: ≤ 2×.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import frozen_gc
from benchmarks._probe import run_probe
from benchmarks._report import Section, table
from benchmarks._routes import Plane
from benchmarks._stats import (
    Spread,
    fmt_count,
    fmt_mib,
    fmt_ratio,
    fmt_s,
    growth_verdict,
    percentile,
    sample_interleaved,
    spread,
)
from benchmarks._task_routes import (
    ROUTE_KINDS,
    SIDES,
    RouteFigures,
    measure_routes,
    measure_writes,
)
from benchmarks._task_rows import TASKS, TaskStore, fill_settled_tasks, snapshot_from
from controlplane import SubagentControl

__all__ = ["TasksConfig", "run_tasks"]

RESUME_GOAL = 1.10
GET_GOAL = 2.0


@dataclass(frozen=True)
class TasksConfig:
    """How much to measure."""

    rounds: int = 7
    resume_ops: int = 120
    resume_pool: int = 8
    live: int = 100
    steer_ops: int = 200
    small: int = 1000
    large: int = 1_000_000
    ready_runs: int = 11
    warm_runs: int = 21
    get_ops: int = 1000

    @classmethod
    def quick(cls) -> TasksConfig:
        """A smoke run: seconds, not citable."""
        return cls(
            rounds=2,
            resume_ops=6,
            resume_pool=2,
            live=10,
            steer_ops=30,
            large=100_000,
            ready_runs=1,
            warm_runs=2,
            get_ops=100,
        )


def run_tasks(config: TasksConfig, workdir: Path) -> Section:
    """Measure the three figures; the report section."""
    routes = measure_routes(
        workdir,
        rounds=config.rounds,
        steers=config.steer_ops,
        resumes=config.resume_ops,
        pool=config.resume_pool,
        live=config.live,
    )
    writes = measure_writes(workdir, rounds=config.rounds, ops=config.steer_ops)
    stores = {
        n: fill_settled_tasks(workdir / f"tasks-{n}.db", n) for n in (config.small, config.large)
    }
    ready = _readiness(config, stores)
    warm = _readiness_in_process(config, stores)
    reads = {n: _read_cost(config, store) for n, store in stores.items()}
    return _section(config, _Figures(routes, writes, stores, ready, warm, reads))


@dataclass(frozen=True)
class _Figures:
    routes: RouteFigures
    writes: dict[str, list[float]]
    stores: dict[int, TaskStore]
    ready: dict[int, list[Any]]
    warm: dict[int, list[tuple[float, float]]]
    reads: dict[int, dict[str, list[float]]]


# -- readiness over many settled Tasks ----------------------------------------------


def _readiness(config: TasksConfig, stores: dict[int, TaskStore]) -> dict[int, list[Any]]:
    """One fresh interpreter per run and store; the stores alternate, the first rotating."""
    ready: dict[int, list[Any]] = {n: [] for n in stores}
    order = list(stores.items())
    for run in range(config.ready_runs):
        shift = run % len(order)
        for n, store in order[shift:] + order[:shift]:
            ready[n].append(run_probe("ready", store.url, store.child_id, store.parent))
    return ready


def _readiness_in_process(
    config: TasksConfig, stores: dict[int, TaskStore]
) -> dict[int, list[tuple[float, float]]]:
    """The same open and first send in this process, a new control plane each run (the
    interpreter warm, the store's connections new): ``(open_s, ready_s)`` per run."""
    out: dict[int, list[tuple[float, float]]] = {n: [] for n in stores}
    order = list(stores.items())
    with frozen_gc():
        for run in range(config.warm_runs):
            shift = run % len(order)
            for n, store in order[shift:] + order[:shift]:
                t0 = time.perf_counter()
                plane = Plane.open(store.url)
                try:
                    opened = time.perf_counter() - t0
                    resumed = plane.resume(store.child_id)
                finally:
                    plane.close()
                out[n].append((opened, opened + resumed.to_provider_s))
    return out


# -- tasks.get from the store against one raw select ---------------------------------


_READ_KINDS = ("get", "ledger", "raw+model", "raw")


def _read_cost(config: TasksConfig, store: TaskStore) -> dict[str, list[float]]:
    """Per round, each read's p50: `tasks.get`, `TaskLedger.get`, the raw select with the
    snapshot built by hand, the raw select alone — all of random rows of ``store.sample``."""
    control = SubagentControl.open(store.url)
    raw = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    try:
        columns = [row[1] for row in raw.execute(f"PRAGMA table_info({TASKS})")]
        select = f"SELECT {', '.join(columns)} FROM {TASKS} WHERE task_id = ?"
        ledger = control.store.ledger if control.store is not None else None
        assert ledger is not None
        picks = store.sample
        # Each kind its own rows: with one sequence for all, the kinds of a turn read the
        # same 20 rows one after another, and the second kind on a connection (the raw
        # select after raw+model's, `TaskLedger.get` after `tasks.get`'s) found their
        # pages in that connection's cache, which a random read of a large store does not.
        rngs = {kind: random.Random(5 + n) for n, kind in enumerate(_READ_KINDS)}

        def pick(kind: str) -> tuple[str, str]:
            return picks[rngs[kind].randrange(len(picks))]

        def get() -> None:
            task_id, owner = pick("get")
            control.tasks.get(task_id, requester=owner)

        def raw_select(kind: str) -> tuple[Any, ...]:
            row: tuple[Any, ...] = raw.execute(select, (pick(kind)[0],)).fetchone()
            return row

        ops: dict[str, Callable[[], object]] = {
            "get": get,
            "ledger": lambda: ledger.get(pick("ledger")[0]),
            "raw+model": lambda: snapshot_from(raw_select("raw+model")),
            "raw": lambda: raw_select("raw"),
        }
        for op in ops.values():  # warm: each path's statements and pages
            for _ in range(20):
                op()
        out: dict[str, list[float]] = {kind: [] for kind in _READ_KINDS}
        with frozen_gc():
            for _ in range(config.rounds):
                for kind, samples in sample_interleaved(ops, config.get_ops).items():
                    out[kind].append(percentile(samples, 50))
    finally:
        raw.close()
        control.close()
    return out


# -- the report ---------------------------------------------------------------------------


def _section(config: TasksConfig, figures: _Figures) -> Section:
    routes, stores, ready, reads = figures.routes, figures.stores, figures.ready, figures.reads
    resume = routes.ratio("resume")
    steer = routes.ratio("steer")
    resume_met = resume.median <= RESUME_GOAL
    if steer.runs == 1:
        steer_verdict = "one round only, no verdict"
    elif steer.low <= 1.0 <= steer.high:
        steer_verdict = "unchanged within noise (the rounds' range spans 1×)"
    else:
        # The steer writes no Task row: a difference here is between the two planes.
        steer_verdict = f"**{'slower' if steer.median > 1 else 'faster'} in every round**"
    small, large = config.small, config.large
    growth = spread(
        [b["ready_s"] / a["ready_s"] for a, b in zip(ready[small], ready[large], strict=True)]
    )
    warm = figures.warm
    warm_growth = _per_round([r for _, r in warm[large]], [r for _, r in warm[small]])
    ready_flat = all(_is_flat(g) for g in (growth, warm_growth))
    get_ratio = {n: _per_round(r["get"], r["raw"]) for n, r in reads.items()}
    get_met = all(r.median <= GET_GOAL for r in get_ratio.values())
    body = f"""\
SQLite store (file, WAL, `synchronous=NORMAL`) throughout. A Task row is written when the
Task is admitted, on the child's supervisor thread before the activation starts — for a
resume in one transaction with the claim on its child (`SqlStore.admit_claiming`, the
store's cursor path), for a new child's start on its own (`TaskLedger.admit`) — and updated
when it settles, in the same transaction as the turn's `turn/end` (which also releases the
claim).

**Cost of the Task rows on the routes.** Three control planes in this process, each on its
own store file seeded alike ({config.resume_pool} idle children of 10 messages,
{config.live} live children):

- *with Task rows*: as shipped;
- *without* (the baseline): its Task service has no ledger (`control._tasks._ledger = None`
  before any Task starts), so it writes no Task row: no admission `INSERT`, no settlement
  `UPDATE` of its own (written only when a turn had no `turn/end`), notices kept in
  memory, no Task read from the store; the settlement inside `turn/end` stays one `UPDATE`
  statement in that transaction, which there matches no row. A resume still claims its
  child before the provider is called — the shipped claim read and update under the
  child's lock, in a transaction of its own — because SPEC §9's one activation per child
  across runtimes needs that claim whether or not Tasks are kept; its appends carry the
  fencing number and its `turn/end` releases the claim, as shipped;
- *bare*: no ledger and no claim either, so a resume writes nothing before
  `provider.resume` — the route before SPEC §9, for the record.

The shipped admission writes the Task row inside the claim's transaction (one round trip,
as the claim alone), so *with / without* prices the Task row and *with / bare* the claim
and the Task row together. Each of {config.rounds} rounds times {config.steer_ops} steers
per side (turns of 20, the sides taking turns) and {config.resume_ops} resumes per side
(the sides taking turns, the first side rotating); a ratio is taken inside each round.
After the run the shipped store held {routes.task_rows["with"]:,} Task rows, the others
{routes.task_rows["without"]} and {routes.task_rows["bare"]}.

{_route_table(routes, config.live)}

Resume route, with Task rows / without, p50: {fmt_ratio(resume)}, {resume.median - 1:+.0%} —
goal ≤ +10%: {"met" if resume_met else "**not met**"}. Steer p50: {fmt_ratio(steer)} —
{steer_verdict}. With the claim priced in too (with / bare), the resume route is
{fmt_ratio(routes.ratio("resume", base="bare"))}: the claim is SPEC §9's one added round
trip (issue 15), not a cost of keeping Tasks.
{_admission(figures.writes, routes)}

**Open and first send with {small:,} vs {large:,} settled Tasks in the store.** Each store
holds one idle child (10 messages), {small:,} or {large:,} settled Tasks of 1,000 owner
sessions and children, and 5 closed runtimes (`benchmarks._task_rows`: generated by SQLite
in one transaction, the large one in {fmt_s(stores[large].fill_s)}). Each run is a fresh
interpreter (`benchmarks._probe ready`): `SubagentControl.open(url)` — schema check,
runtime row, the first sweep for dead runtimes' running Tasks — then the first
`send_message` to the child: answered (its Task admitted, a row among the others), then
`provider.resume` called with the rebuilt child. {config.ready_runs} run(s) per store, the
stores alternating:

{_ready_table(stores, ready)}

Ready time with {large:,} settled Tasks / with {small:,}, per run: {fmt_ratio(growth)} —
{growth_verdict(growth, "settled Tasks")}. A fresh interpreter's figures move with the
machine's load, so the same open and first send is also timed in this process, more often:
a new control plane on each store in turn ({config.warm_runs} runs each, the interpreter
warm, the store's connections new):

{_warm_table(figures.warm)}

Ready time with {large:,} settled Tasks / with {small:,}, per run, in this process:
{fmt_ratio(warm_growth)} — {growth_verdict(warm_growth, "settled Tasks")}. Goal flat:
{"met" if ready_flat else "**not met**"}.

**`tasks.get` of a stored Task not in memory** (another runtime's, closed) against one
raw `sqlite3` primary-key select of the same row (`SELECT` of every column, `fetchone`,
on a connection kept open on the same file). Random rows of a 1,000-row sample (each kind
its own sequence), after a warm-up; {config.rounds} rounds of {config.get_ops} reads per
kind, interleaved in turns of 20. Between them: `TaskLedger.get` (the store's read, no
owner fence) and the raw select plus building the frozen `TaskSnapshot` by hand:

{_read_table(reads, get_ratio)}

Goal: `tasks.get` ≤ {GET_GOAL:.0f}× the raw select — {"met" if get_met else "**not met**"}.
{_read_breakdown(reads[large], large)}
"""
    data: dict[str, object] = {
        "resume_ratio": resume,
        "steer_ratio": steer,
        "ready_growth": growth,
        "ready_growth_in_process": warm_growth,
        "get_ratio": get_ratio,
    }
    return Section("Durable Tasks", body, data)


def _is_flat(growth: Spread) -> bool:
    """No growth to speak of: the runs' range spans 1×, or the median is within 10%."""
    return growth.low <= 1.0 <= growth.high or abs(growth.median - 1.0) <= 0.10


def _warm_table(warm: dict[int, list[tuple[float, float]]]) -> str:
    rows = [
        [
            f"{n:,}",
            fmt_s(spread([o for o, _ in runs])),
            fmt_s(spread([r for _, r in runs])),
        ]
        for n, runs in warm.items()
    ]
    return table(["settled Tasks", "open", "open + first send → provider.resume"], rows)


def _per_round(num: list[float], den: list[float]) -> Spread:
    return spread([a / b for a, b in zip(num, den, strict=True)])


def _route_table(routes: RouteFigures, live: int) -> str:
    rows = []
    labels = {
        "resume": "send → `provider.resume` (resume route)",
        "settled": "send → Task settled (`tasks.wait` returns; the run ends at once)",
        "steer": f"steer round trip ({live} live children)",
    }
    for kind in ROUTE_KINDS:
        for q, per_round in ((50, routes.p50), (90, routes.p90)):
            rows.append(
                [
                    f"{labels[kind]}, p{q}",
                    *(fmt_s(spread(per_round[f"{kind} {side}"])) for side in SIDES),
                    fmt_ratio(routes.ratio(kind, q)),
                    fmt_ratio(routes.ratio(kind, q, base="bare")),
                ]
            )
    header = ["", "with Task rows", "without (baseline)", "bare", "with / without"]
    return table([*header, "with / bare"], rows)


def _ready_table(stores: dict[int, TaskStore], ready: dict[int, list[Any]]) -> str:
    rows = []
    for n, runs in ready.items():
        rows.append(
            [
                f"{n:,}",
                f"{stores[n].path.stat().st_size / 1024 / 1024:.0f} MiB",
                fmt_s(spread([r["open_s"] for r in runs])),
                fmt_s(spread([r["sent_s"] for r in runs])),
                fmt_s(spread([r["ready_s"] for r in runs])),
                fmt_count(spread([r["status"]["threads"] for r in runs])),
                fmt_mib(spread([r["status"]["rss"] for r in runs])),
            ]
        )
    header = [
        "settled Tasks",
        "database",
        "open",
        "open + first send answered",
        "open + first send → provider.resume",
        "threads",
        "VmRSS",
    ]
    return table(header, rows)


def _read_table(reads: dict[int, dict[str, list[float]]], ratio: dict[int, Spread]) -> str:
    rows = [
        [
            f"{n:,}",
            fmt_s(spread(r["get"])),
            fmt_s(spread(r["ledger"])),
            fmt_s(spread(r["raw+model"])),
            fmt_s(spread(r["raw"])),
            fmt_ratio(ratio[n]),
        ]
        for n, r in reads.items()
    ]
    header = [
        "settled Tasks",
        "`tasks.get` p50",
        "`TaskLedger.get` p50",
        "raw select + `TaskSnapshot` p50",
        "raw select p50",
        "`tasks.get` / raw select",
    ]
    return table(header, rows)


def _admission(writes: dict[str, list[float]], routes: RouteFigures) -> str:
    """What the baselines do not pay on the resume route: the Task row, and the claim."""
    admit, append = spread(writes["admit"]), spread(writes["append"])
    row, whole = (
        spread(
            [
                a - b
                for a, b in zip(
                    routes.p50["resume with"], routes.p50[f"resume {base}"], strict=True
                )
            ]
        )
        for base in ("without", "bare")
    )
    on_route = spread(routes.p50["admit"])
    return f"""
Per resume (p50 with − p50 of the other side, per round) the Task row costs {fmt_s(row)}:
its `INSERT` inside the claim's transaction, and the pages it adds to that commit (the
Task table, its primary key, its owner index and its partial running index). The claim
and the row together cost {fmt_s(whole)}: timed where it runs, on the supervisor thread
before the activation starts, each `SqlStore.admit_claiming` (the claim read, the claim
update and the Task `INSERT` in one `BEGIN IMMEDIATE` transaction, on the store's cursor
path) took {fmt_s(on_route)} (p50 per round).

A new child's start admits its Task on its own through `TaskLedger.admit`: the same
`INSERT` on the store's cursor path, in a transaction of its own. Timed alone in a tight
loop on one store ({len(writes["admit"])} rounds, p50, interleaved), it takes
{fmt_s(admit)} against {fmt_s(append)} for `SqlStore.append` of one event (the store's hot
path, also a one-row write transaction) — {_ratio_text(writes["admit"], writes["append"])}
apart.
"""


def _ratio_text(num: list[float], den: list[float]) -> str:
    return fmt_ratio(_per_round(num, den))


def _read_breakdown(r: dict[str, list[float]], n: int) -> str:
    """Where a stored read's time goes, from the medians of the parts (``n`` Tasks)."""
    med = {kind: spread(values).median for kind, values in r.items()}
    get = med["get"]
    parts = [
        ("the select itself (raw `sqlite3`)", med["raw"]),
        (
            "the store's read around it (the select on a connection and cursor kept for "
            "these reads, the retry policy, the frozen `TaskSnapshot` built from the row "
            "without validation)",
            med["ledger"] - med["raw"],
        ),
        ("the Task service (memory lookups, owner fence)", get - med["ledger"]),
    ]
    lines = [
        f"- {what}: {fmt_s(max(part, 0.0))} ({max(part, 0.0) / get:.0%})" for what, part in parts
    ]
    return (
        f"\nWhere a `tasks.get` of a stored Task spends its {fmt_s(get)} ({n:,} Tasks; "
        "medians of the parts above, so the shares are approximate; `python -m benchmarks "
        "--profile` prints a cProfile of these reads):\n\n"
        + "\n".join(lines)
        + "\n\nBuilding the same snapshot by hand with validation (raw select + `TaskSnapshot` "
        f"above) adds {fmt_s(max(med['raw+model'] - med['raw'], 0.0))} to the select.\n"
    )
