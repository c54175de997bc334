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

__all__ = ["ROUTE_KINDS", "SIDES", "RouteFigures", "measure_routes", "measure_writes"]

SIDES = ("with", "without")
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

    def ratio(self, kind: str, q: int = 50) -> Spread:
        """With Task rows over without, per round, at percentile ``q`` (50 or 90)."""
        per_round = self.p50 if q == 50 else self.p90
        with_, without = per_round[f"{kind} with"], per_round[f"{kind} without"]
        return spread([a / b for a, b in zip(with_, without, strict=True)])


def without_task_rows(plane: Plane) -> None:
    """Take the Task service's ledger away, before any Task starts: no admission
    ``INSERT``, no settlement ``UPDATE`` of its own, notices kept in memory, and no store
    read for a Task it does not hold. The settlement written with a turn's ``turn/end``
    stays in that transaction as one ``UPDATE`` statement that finds no row."""
    tasks = plane.control.tasks
    if getattr(tasks, "_ledger", None) is None or tasks.running():
        raise RuntimeError("TaskService no longer keeps its ledger in _ledger; fix the baseline")
    tasks._ledger = None


class _TimedAdmit:
    """Stands in for a resume's admission (the Task row written with the claim on its
    child, one transaction) and records how long each call took."""

    def __init__(self, admit: Callable[[TaskSnapshot], int | None]) -> None:
        self._admit = admit
        self.samples: list[float] = []

    def __call__(self, task: TaskSnapshot) -> int | None:
        t0 = time.perf_counter()
        fence = self._admit(task)
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
        without_task_rows(planes["without"])
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
        tasks = planes["with"].control.tasks
        assert tasks._claimer is not None
        admit = _TimedAdmit(tasks._claimer)
        tasks.on_claim(admit)
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
    if out.task_rows["without"] != 0 or out.task_rows["with"] == 0:
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
    """``count`` resumes per side, alternating sides, the first side alternating too."""
    to_provider: dict[str, list[float]] = {side: [] for side in SIDES}
    to_settled: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(count):
        for side in SIDES if (i + round_no) % 2 == 0 else SIDES[::-1]:
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
