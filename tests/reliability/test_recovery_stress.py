"""Recovery under load: the restart stress run (`test_restart_stress.py`) with its runtimes
SIGKILLed and restarted while they send, and recovery on (the default).

Three worker processes (``stress_child.py`` with ``SUBAGENT_CONTROL_STRESS_RECOVERY=1``:
a provider that carries a dead runtime's turn on and whose every run completes, and a load
that kills no Task) run the cross-process stress load against four shared children. While
they send, a fault schedule SIGKILLs one worker at a time and starts its replacement at
once (a new runtime with the provider, which runs the load too), so at least one runtime
is alive at all times; on PostgreSQL it also crashes the server (shorter than the
ride-through, restart included) and cuts worker ``p2`` off for two leases or more (long
enough for the others to judge it dead and carry its Tasks on). What may end a
Task ``interrupted`` is kept out: an outage past the ride-through, or a cut so short that
the runtime comes back fenced before anyone took its Tasks over, ends its running Tasks
``interrupted`` by design (its own lease watchdog stopped them). Each worker appends what
every send was told as soon as it is answered, so a SIGKILLed one's answered sends are
accounted for too. Then:

- 0 lost, 0 duplicated, 0 refused-but-stored messages (`load.account`);
- 0 double activations (the per-child lock journal, which SIGKILLed workers wrote too);
- 0 open turns behind a settled Task; 0 wedged children (`reachability.Reachability`);
- every Task ``completed``: none ``interrupted`` (a dead runtime's running Task is
  carried on as the same Task in the same turn; the workers' ``max_recoveries`` is above
  the schedule's kills, since a Task may meet several);
- the time from a SIGKILL to the recovered turn's next call in another runtime (the
  provider's journalled ``recovered``), against ``lease_ttl_s``.

The CI size runs in the ``slow`` suite (SQLite: four kills; PostgreSQL: four kills, a
crash and a partition; about a minute each; a kill aims at a worker with an activation
live, per the lock journal). ``SUBAGENT_CONTROL_RESTART_STRESS=1`` runs
the full size instead (`FULL_ROUNDS` faults, drawn from ``SUBAGENT_CONTROL_STRESS_SEED``;
``SUBAGENT_CONTROL_RESTART_STRESS_ROUNDS=N`` for N). Figures go to the summary file as
``recovery_stress``, and to ``summary.json`` in the test's folder, pass or fail (run with
``--basetemp DIR`` to keep it with the lock journal, the workers' logs and the Tasks as
stored).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane import ErrorCode, EventKind, SubagentControl, TaskStatus
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.processes import Reaper, reaping
from tests.reliability.reachability import Reachability
from tests.reliability.stress_child import (
    LEASE_ENV,
    MAX_RECOVERIES_ENV,
    PACE_ENV,
    PARENT,
    RECOVERY_ENV,
    RecoveringSteppingProvider,
)
from tests.reliability.summary import kept_figures
from tests.reliability.test_restart_stress import ROUNDS_ENV, RUN_ENV, check_stress_run
from tests.reliability.test_stress_processes import (
    READY_S,
    SEND_S,
    Reports,
    Worker,
    idle_children,
)

pytestmark = [pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")

WORKERS = 3
PARTITIONED = WORKERS - 1
LEASE_S = 6.0
"""Half of it (3 s) is the ride-through a server crash and its restart stay within: a
longer outage fences the runtimes, whose running Tasks then end ``interrupted`` by design
(an outage is no runtime's end)."""
SENDS = 24
"""Sends per sender thread of each worker (and of each replacement) at the CI size."""
PACE_S = 0.5
"""A sender's mean pause after each send: a worker's load lasts about SENDS x PACE_S, so
that the SIGKILLs land among its turns."""
MAX_RECOVERIES = 20
"""The workers' ``max_recoveries``: above any schedule's kills, so that a Task that meets
several of them in its turn (it moves to a replacement, which is killed in turn) is carried
on each time (the bound itself is `test_recovery.py`'s)."""
FULL_ROUNDS = 16
FULL_SENDS = 40
LONGEST_CRASH_S = 1.5
"""The longest server crash of the schedule: with the server's restart (about a second on
a loaded host) within the ride-through (half the lease)."""
CI_SCHEDULE: dict[str, list[tuple[str, float]]] = {
    "sqlite": [("kill", 0), ("kill", 1), ("kill", 2), ("kill", 0)],
    "postgres": [
        ("kill", 0),
        ("crash", 1.0),
        ("kill", 1),
        ("partition", LEASE_S * 2),
        ("kill", 2),
        ("kill", 0),
    ],
}
"""The CI size: one SIGKILL of each worker (and one more), and on PostgreSQL a server crash
within the ride-through and a partition of p2 past its lease."""


def _schedule(backend: str) -> list[tuple[str, float]]:
    rounds = int(os.environ.get(ROUNDS_ENV, "0")) or (
        FULL_ROUNDS if os.environ.get(RUN_ENV) == "1" else 0
    )
    if rounds <= 0:
        return CI_SCHEDULE[backend]
    rng = random.Random(f"{os.environ.get('SUBAGENT_CONTROL_STRESS_SEED', '')}:recovery-stress")
    schedule: list[tuple[str, float]] = []
    for _ in range(rounds):
        roll = rng.random()
        if backend == "sqlite" or roll < 0.6:
            schedule.append(("kill", rng.randrange(WORKERS)))
        elif roll < 0.8:
            schedule.append(("crash", rng.uniform(0.5, LONGEST_CRASH_S)))
        else:
            schedule.append(("partition", LEASE_S * rng.uniform(2.0, 2.5)))
    return schedule


@dataclass
class Fleet:
    """The worker processes: the live one of each slot, and every one that ever ran."""

    urls: list[str]
    children: list[str]
    sends: int
    workdir: Path
    reaped: Reaper
    live: list[Worker] = field(default_factory=list)
    every: list[Worker] = field(default_factory=list)
    runtime_of: dict[str, str] = field(default_factory=dict)
    killed: dict[str, float] = field(default_factory=dict)  # runtime id -> SIGKILL time
    killed_names: set[str] = field(default_factory=set)

    def start(self, slot: int, incarnation: int) -> Worker:
        name = f"p{slot}" if incarnation == 0 else f"p{slot}r{incarnation}"
        worker = self.reaped.add(
            Worker(
                self.urls[slot],
                name,
                self.children,
                self.sends,
                self.workdir,
                # Each incarnation its own workload.
                int(os.environ.get("SUBAGENT_CONTROL_STRESS_SEED", "20240607"))
                + slot
                + 10 * incarnation,
                env={
                    LEASE_ENV: str(LEASE_S),
                    RECOVERY_ENV: "1",
                    PACE_ENV: str(PACE_S),
                    MAX_RECOVERIES_ENV: str(MAX_RECOVERIES),
                    "SUBAGENT_CONTROL_STRESS_WATCHDOG_S": "600",
                },
            )
        )
        self.every.append(worker)
        self.runtime_of[name] = worker.expect("ready ", READY_S)
        return worker

    def go(self, worker: Worker) -> None:
        worker.say("go")

    def mid_turn(self, slot: int) -> int:
        """A slot whose worker runs an activation right now (per the lock journal: entered,
        not yet left), ``slot`` first; ``slot`` itself if none does within a bound."""
        deadline = time.monotonic() + LEASE_S
        while time.monotonic() < deadline:
            live: Counter[str] = Counter()
            for line in _journal(self.workdir / "locks"):
                live[line[1]] += {"enter": 1, "overlap": 1, "leave": -1}.get(line[2], 0)
            busy = [
                s for s in (slot, *range(WORKERS))
                if live[str(self.live[s].proc.pid)] > 0 and "sent" not in self.live[s].lines()
            ]  # fmt: skip
            if busy:
                return busy[0]
            time.sleep(0.05)  # polling other processes' journal, bounded
        return slot

    def kill(self, slot: int) -> None:
        """SIGKILL the slot's live worker and start its replacement at once."""
        worker = self.live[slot]
        worker.proc.kill()
        self.killed[self.runtime_of[worker.name]] = time.monotonic()
        self.killed_names.add(worker.name)
        worker.reap()
        incarnation = sum(1 for w in self.every if w.name.split("r")[0] == f"p{slot}")
        replacement = self.start(slot, incarnation)
        self.live[slot] = replacement
        self.go(replacement)


def _faults(
    fleet: Fleet,
    schedule: list[tuple[str, float]],
    server: PostgresServer | None,
    proxy: TcpProxy | None,
    done: list[str],
    probe: Callable[[str], None],
) -> None:
    rng = random.Random("recovery-stress-gaps")
    for fault, value in schedule:
        time.sleep(rng.uniform(0.5, 1.5))  # load between faults (a schedule, not a sync)
        if fault == "kill":
            slot = fleet.mid_turn(int(value))  # mid-turn, where it can be
            fleet.kill(slot)
            done.append(f"p{slot} SIGKILLed, restarted")
            continue  # the others never lost the store: nothing healed to probe
        if fault == "crash":
            assert server is not None
            server.crash()
            time.sleep(value)
            server.start()
        else:
            assert proxy is not None
            proxy.hold()
            time.sleep(value)
            proxy.release()
        done.append(f"{fault} {value:.1f}s")
        probe(done[-1])  # healed: every child reachable within lease + 1 s


def _journal(locks: Path) -> list[list[str]]:
    path = locks / "journal"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines()]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_runtimes_sigkilled_and_restarted_under_load_carry_every_task_to_completed(
    backend: str, tmp_path: Path, reaped: Reaper, request: pytest.FixtureRequest
) -> None:
    full = bool(os.environ.get(ROUNDS_ENV)) or os.environ.get(RUN_ENV) == "1"
    schedule = _schedule(backend)
    with kept_figures(
        "recovery_stress", "postgres" if backend == "postgres" else "sqlite", tmp_path
    ) as kept:
        kept.update({"size": "full" if full else "ci", "schedule": schedule})
        server: PostgresServer | None = None
        proxies: list[TcpProxy] = []
        if backend == "postgres":
            server = request.getfixturevalue("pg_server")
            log = server.log
            # The server's log (its lock waits name who held a child's lock) beside the run's.
            request.addfinalizer(lambda: shutil.copy(log, tmp_path / "server.log"))
            url = server.new_database()
            factory = request.getfixturevalue("tcp_proxy_factory")
            proxies = [factory(server.port) for _ in range(WORKERS)]
            urls = [proxy.url(url) for proxy in proxies]
        else:
            url = str(request.getfixturevalue("sqlite_url"))
            urls = [url] * WORKERS
        began = time.monotonic()
        setup, children, _setup_runtime = idle_children(url, tmp_path)
        locks = tmp_path / "locks"

        fleet = Fleet(urls, children, FULL_SENDS if full else SENDS, tmp_path, reaped)
        done: list[str] = []
        kept["faults"] = done  # filled as they happen: kept whatever fails
        reach = Reachability(url, LEASE_S, locks, provider=RecoveringSteppingProvider)
        try:
            fleet.live = [fleet.start(slot, 0) for slot in range(WORKERS)]
            go = time.monotonic()
            for worker in fleet.live:
                fleet.go(worker)
            _faults(
                fleet,
                schedule,
                server,
                proxies[PARTITIONED] if proxies else None,
                done,
                lambda fault: reach.probe(children, time.monotonic(), fault),
            )
            for worker in fleet.live:
                assert worker.next_line(SEND_S * 2) == "sent", worker.stderr()
            sending_s = time.monotonic() - go
            closing_at = datetime.now(UTC)
            for worker in fleet.live:
                worker.say("close")
            for worker in fleet.live:
                assert worker.next_line(60) == "closed", worker.stderr()
                assert worker.proc.wait(10) == 0, worker.stderr()
        finally:
            kept["reachability"] = reach.figures()
            reach.close()

        # Every worker's answered sends: the closed ones' reports, the killed ones' journals.
        journal = _journal(locks)
        pid_of = {worker.name: worker.proc.pid for worker in fleet.every}
        reports = Reports(dict(fleet.runtime_of), closing_at=closing_at)
        for worker in fleet.every:
            overlaps = [line[3] for line in journal if line[2] == "overlap" and line[1] == str(
                pid_of[worker.name])]  # fmt: skip
            if worker.name in fleet.killed_names:
                sent, refusals, _ = worker.report(worker.out.with_name(worker.out.name + ".sends"))
                figures: dict[str, Any] = {"overlaps": overlaps, "errors": []}
            else:
                sent, refusals, figures = worker.report()
            reports.sent.extend(sent)
            reports.refusal_of.update(refusals)
            reports.figures[worker.name] = figures
        overlaps = [line[3] for line in journal if line[2] == "overlap"]
        codes = {ErrorCode.NOT_DELIVERED, ErrorCode.STORE_UNAVAILABLE, ErrorCode.DURABILITY_FAILED}
        if backend == "sqlite":
            codes.add(ErrorCode.OWNERSHIP_CONFLICT)
        figures, failures = check_stress_run(
            url, setup, children, reports, partitioned={f"p{PARTITIONED}"}, reach=reach,
            refusals=frozenset(codes), overlaps=overlaps, keep=tmp_path,
        )  # fmt: skip

        with SubagentControl.open(url) as control:
            assert control.store is not None
            tasks = control.store.ledger.owned_by(PARENT)
            recovered_events = sum(
                1
                for child_id in children
                for event in control.store.load(child_id).events
                if event.kind == EventKind.TASK_RECOVERED
            )
        statuses = Counter(task.status.value for task in tasks)
        not_completed = [
            f"{task.id} {task.status.value}: {((task.outcome and task.outcome.detail) or '')[:160]}"
            for task in tasks
            if task.status is not TaskStatus.COMPLETED
        ]
        # A SIGKILL's recovered turns: death -> the provider's next call in another runtime.
        after_kill = [
            float(line[0]) - fleet.killed[line[5]]
            for line in journal
            if line[2] == "recovered" and len(line) > 5 and line[5] in fleet.killed
        ]
        taken_over = sum(
            1 for line in journal if line[2] == "recovered" and len(line) > 5
            and line[5] not in fleet.killed
        )  # fmt: skip
        kills = sum(1 for fault, _ in schedule if fault == "kill")
        kept.update(
            {
                "seed": os.environ.get("SUBAGENT_CONTROL_STRESS_SEED", "20240607"),
                "size": "full" if full else "ci",
                "lease_ttl_s": LEASE_S,
                "faults": done,
                "kills": kills,
                "workers_run": len(fleet.every),
                "elapsed_s": round(time.monotonic() - began, 2),
                "sending_s": round(sending_s, 2),
                "tasks": len(tasks),
                "tasks_completed": statuses[TaskStatus.COMPLETED.value],
                "recoveries": sum(task.recoveries for task in tasks),
                "tasks_recovered": sum(1 for task in tasks if task.recoveries),
                "most_recoveries_of_one_task": max((t.recoveries for t in tasks), default=0),
                "recovered_events": recovered_events,
                "recovered_after_a_sigkill": len(after_kill),
                "recovered_from_a_live_runtime_cut_off": taken_over,
                "death_to_next_call_s": {
                    "p50": round(statistics.median(after_kill), 3) if after_kill else None,
                    "p99": round(_percentile(after_kill, 0.99), 3) if after_kill else None,
                    "max": round(max(after_kill), 3) if after_kill else None,
                },
                "not_completed": not_completed[:20],
                **figures,
            }
        )

        assert len(done) == len(schedule), done
        assert failures == [], failures
        assert not_completed == [], not_completed
        assert figures["tasks_interrupted"] == 0
        # The run did what it is for: Tasks of SIGKILLed runtimes were carried on elsewhere.
        assert after_kill, "no Task was running in a SIGKILLed runtime"
        assert max(t.recoveries for t in tasks) <= MAX_RECOVERIES
