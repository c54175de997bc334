"""The routes with and without Task rows, and the two writes that tell them apart.

`measure_routes` runs two control planes side by side in this process, each on its own
store file seeded alike: one as shipped, one whose Task service has no ledger
(`without_task_rows`). Steers and resumes alternate between them, so a ratio within one
round compares the two under the same conditions.

The admission write (the Task row with the claim on its child, `SqlStore.admit_claiming`),
the part of the resume route the baseline does not pay, is also timed where it runs, on
the shipped side's supervisor thread. `measure_writes` times a start's admission
(`TaskLedger.admit`, the Task row alone) on one store, interleaved with the store's hot
write path (`SqlStore.append` of one event, what a steer commits).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._harness import PARENT_SESSION, frozen_gc, seed_child, sqlite_url
from benchmarks._routes import SOURCE, TEXT, Plane
from benchmarks._stats import Spread, percentile, sample_interleaved, spread
from benchmarks._task_rows import TASKS
from controlplane import EventKind, NewEvent, TaskSnapshot, TaskStatus
from persistence import SqlStore
from persistence._claims import IsDead

__all__ = ["ROUTE_KINDS", "SIDES", "RouteFigures", "measure_routes", "measure_writes"]

SIDES = ("with", "without", "bare")
ROUTE_KINDS = ("resume", "settled", "steer")
_EVENT = NewEvent(kind=EventKind.STEERING_MESSAGE, turn=1, data={"text": TEXT}, source=SOURCE)


@dataclass
class RouteFigures:
    """Per round, each ``"<kind> <side>"``'s p50 and p90 (seconds), and ``"admit"``: the
    admissions during the shipped side's resumes; the Task rows each side's store held
    afterwards."""

    p50: dict[str, list[float]] = field(default_factory=dict)
    p90: dict[str, list[float]] = field(default_factory=dict)
    task_rows: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, samples: list[float]) -> None:
        """One round's samples of ``kind``."""
        self.p50.setdefault(kind, []).append(percentile(samples, 50))
        self.p90.setdefault(kind, []).append(percentile(samples, 90))

    def ratio(self, kind: str, q: int = 50, *, base: str = "without") -> Spread:
        """With Task rows over ``base`` (a side), per round, at percentile ``q`` (50 or
        90)."""
        per_round = self.p50 if q == 50 else self.p90
        with_, other = per_round[f"{kind} with"], per_round[f"{kind} {base}"]
        return spread([a / b for a, b in zip(with_, other, strict=True)])


def without_task_rows(plane: Plane, *, keep_claims: bool) -> None:
    """Take the Task service's ledger away, before any Task starts: no admission
    ``INSERT``, no settlement ``UPDATE`` of its own, notices kept in memory, and no store
    read for a Task it does not hold. The settlement written with a turn's ``turn/end``
    stays in that transaction as one ``UPDATE`` statement that finds no row.

    With ``keep_claims`` a resume still claims its child before the provider is called
    (SPEC §9's one activation per child across runtimes, which needs no Task row): the
    shipped claim, read and update under the child's lock, in a transaction of its own
    (`_claim_only`), so its appends carry the fencing number and its ``turn/end``
    releases the claim as shipped. Without, a resume writes nothing before the provider
    is called: the route as it was before SPEC §9."""
    tasks = plane.control._tasks
    store = plane.control.store
    runtime = plane.control._runtime
    if getattr(tasks, "_ledger", None) is None or tasks.running():
        raise RuntimeError("TaskService no longer keeps its ledger in _ledger; fix the baseline")
    if store is None or runtime is None:
        raise RuntimeError("the plane has no store or runtime; fix the baseline")
    tasks._ledger = None
    if keep_claims:
        tasks._claimer = _claim_only(store, runtime._is_dead)
    else:
        tasks._claimer = None


def _claim_only(store: SqlStore, is_dead: IsDead) -> Callable[..., int | None]:
    """`SqlStore.admit_claiming` without its Task ``INSERT``: the same claim statements
    (`Claims.claim_of`, `Claims.claim`) on the store's cursor path, retried alike."""
    claims = store._claims

    def claim(task: TaskSnapshot, *_opening: object) -> int | None:
        # Without the turn's opening too: the activation then writes its frame itself.
        def attempt(_attempt: int) -> int | None:
            with store._db.cursor(write=True) as cursor:
                held = claims.claim_of(cursor, task.child_id)
                fence = claims.claim(cursor, task, task.runtime_id or "", held, is_dead)
            store._committed()
            return fence

        return store._run(f"claim child {task.child_id}", attempt)

    return claim


class _TimedAdmit:
    """Stands in for a resume's admission (the Task row written with the claim on its
    child, one transaction) and records how long each call took."""

    def __init__(self, admit: Callable[..., int | None]) -> None:
        self._admit = admit
        self.samples: list[float] = []

    def __call__(self, task: TaskSnapshot, *opening: object) -> int | None:
        # ``opening``: the turn's frame, written with the claim (absent in older trees).
        t0 = time.perf_counter()
        fence = self._admit(task, *opening)
        self.samples.append(time.perf_counter() - t0)
        return fence


def measure_routes(
    workdir: Path, *, rounds: int, steers: int, resumes: int, pool: int, live: int
) -> RouteFigures:
    """Per round, ``steers`` steers per side (turns of 20, sides alternating) into ``live``
    running children, then ``resumes`` resumes per side of ``pool`` idle children."""
    paths = {side: workdir / f"tasks-{side}.db" for side in SIDES}
    planes = {side: Plane.open(sqlite_url(path)) for side, path in paths.items()}
    out = RouteFigures()
    try:
        without_task_rows(planes["without"], keep_claims=True)
        without_task_rows(planes["bare"], keep_claims=False)
        idle: dict[str, list[str]] = {}
        running: dict[str, list[str]] = {}
        for side, plane in planes.items():
            store = plane.control.store
            assert store is not None
            idle[side] = [seed_child(store, 10) for _ in range(pool)]
            for child_id in idle[side]:  # the first send also creates the supervisor
                plane.resume(child_id)
            running[side] = []
            plane.grow(running[side], live)
        tasks = planes["with"].control._tasks
        assert tasks._claimer is not None
        admit = _TimedAdmit(tasks._claimer)
        tasks._claimer = admit
        rng = {side: random.Random(1) for side in SIDES}
        with frozen_gc():
            for round_no in range(rounds):
                ops = {
                    f"steer {side}": _steer_one(planes[side], running[side], rng[side])
                    for side in SIDES
                }
                for kind, samples in sample_interleaved(ops, steers).items():
                    out.add(kind, samples)
                admit.samples.clear()
                _resume_round(planes, idle, resumes, round_no, out)
                out.add("admit", admit.samples)
    finally:
        for plane in planes.values():
            plane.close()
    out.task_rows = {side: _count_rows(path) for side, path in paths.items()}
    if out.task_rows["without"] or out.task_rows["bare"] or not out.task_rows["with"]:
        raise RuntimeError(f"the baseline did not remove the Task rows: {out.task_rows}")
    return out


def _steer_one(plane: Plane, live: list[str], rng: random.Random) -> Callable[[], None]:
    return lambda: plane.steer(rng.choice(live))


def _resume_round(
    planes: dict[str, Plane],
    idle: dict[str, list[str]],
    count: int,
    round_no: int,
    out: RouteFigures,
) -> None:
    """``count`` resumes per side, the sides taking turns, the first side rotating."""
    to_provider: dict[str, list[float]] = {side: [] for side in SIDES}
    to_settled: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(count):
        first = (i + round_no) % len(SIDES)
        for side in SIDES[first:] + SIDES[:first]:
            resumed = planes[side].resume(idle[side][i % len(idle[side])])
            to_provider[side].append(resumed.to_provider_s)
            to_settled[side].append(resumed.to_settled_s)
    for side in SIDES:
        out.add(f"resume {side}", to_provider[side])
        out.add(f"settled {side}", to_settled[side])


def _count_rows(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {TASKS}").fetchone()[0])


def measure_writes(workdir: Path, *, rounds: int, ops: int) -> dict[str, list[float]]:
    """Per round, the p50 of ``ops`` start admissions (`TaskLedger.admit` of a new running
    Task, built beforehand) and of ``ops`` one-event `SqlStore.append` s, interleaved."""
    store = SqlStore(sqlite_url(workdir / "tasks-writes.db"))
    try:
        child_id = seed_child(store, 10)
        now = datetime.now(UTC)
        tasks = [
            TaskSnapshot(
                id=str(uuid.uuid4()),
                label="bench",
                owner_session=PARENT_SESSION,
                status=TaskStatus.RUNNING,
                child_id=child_id,
                runtime_id="bench-runtime",
                created_at=now,
            )
            for _ in range(rounds * ops)
        ]
        timed = {
            "admit": lambda: store.ledger.admit(tasks.pop()),
            "append": lambda: store.append(child_id, [_EVENT]),
        }
        out: dict[str, list[float]] = {kind: [] for kind in timed}
        with frozen_gc():
            for _ in range(rounds):
                for kind, samples in sample_interleaved(timed, ops).items():
                    out[kind].append(percentile(samples, 50))
    finally:
        store.close()
    return out
