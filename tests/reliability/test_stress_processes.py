"""SPEC §5 send_message and §9 under load across processes: the stress run of test_stress.py,
split over several OS processes that share one store.

Each process (``stress_child.py``) is its own runtime on the test's database and runs the
single-process load (`load.py`: twelve sender threads, kills mixed in, a `SteppingProvider`)
against the same four children, which the test starts up front (their first turns end at
once). A message to an idle child resumes it in the sender's runtime, so the children's
activations run in every process in turn, and many sends meet an activation that runs in
another one: on PostgreSQL they are forwarded there (steered there, or refused), on SQLite
refused ``OWNERSHIP_CONFLICT``; a `steered` reply makes that Task the one the sender's kills
aim at, so kills are forwarded too. Every process reports what it was told for every
message, and the test accounts for each against the stored transcripts exactly as the
single-process stress test does (`load.account`):

- ``steered``: exactly one ``steering/message`` with its text and source, in the turn of the
  Task the caller was told, wherever that Task ran;
- ``started``: exactly one ``user/message`` opening the new Task's turn, also when the Task
  was killed while its provider started (its turn then ends ``killed``);
- refused: nowhere.

Double activations are caught by a file lock per child that every activation, in any
process, holds from entering ``start``/``resume`` to the end of ``dispose`` (non-blocking: a
second one finds it taken and is counted), besides the transcripts' frames (each turn between
one ``turn/start`` and one ``turn/end``, turns 1..k, never interleaved).

Every process is reaped, pass or fail. Figures go to the summary file
(``SUBAGENT_CONTROL_RELIABILITY_SUMMARY``) as ``stress_processes``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    SessionEvent,
    SubagentControl,
    TaskSnapshot,
    TaskStatus,
)
from tests.reliability.load import (
    CHILDREN,
    SEED,
    SETTLE_S,
    THREADS,
    Load,
    Sent,
    account,
    start_children,
)
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.reliability.stepping import Clock
from tests.reliability.stress_child import PARENT, ExclusiveSteppingProvider
from tests.reliability.summary import backend_of, write_summary

SCRIPT = Path(__file__).with_name("stress_child.py")
PROCESSES = 3
# Sends per sender thread in each process: sized so each backend's run stays within ~30 s
# on two cores.
SENDS_PER_THREAD = {"sqlite": 120, "postgres": 40}
READY_S = 45.0
SEND_S = 120.0

pytestmark = pytest.mark.slow


class Worker(LinesProcess):
    """A ``stress_child.py`` process, driven line by line; its stderr kept in ``workdir``."""

    def __init__(
        self,
        url: str,
        name: str,
        children: list[str],
        sends: int,
        workdir: Path,
        seed: int,
        *,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.out = workdir / f"{name}.jsonl"
        super().__init__(
            SCRIPT,
            url,
            name,
            ",".join(children),
            str(sends),
            str(workdir / "locks"),
            str(self.out),
            name=name,
            stderr=workdir / f"{name}.stderr",
            env={**(env or {}), "SUBAGENT_CONTROL_STRESS_SEED": str(seed)},
            prefix=prefix,
        )

    def report(self, path: Path | None = None) -> tuple[list[Sent], dict[str, str], dict[str, Any]]:
        """What every send was told, each refusal's message by text, and the figures
        (read from ``path`` instead: the journal of a worker killed before it reported,
        which has no figures)."""
        sent, refusals, figures = [], {}, {}
        for line in (path or self.out).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record["record"] == "figures":
                figures = record
                continue
            code = record["code"]
            if record["refusal"] is not None:
                refusals[record["text"]] = record["refusal"]
            sent.append(
                Sent(
                    text=record["text"],
                    child_id=record["child_id"],
                    source=MessageSource.model_validate(record["source"]),
                    phase=record["phase"],
                    route=record["route"],
                    task_id=record["task_id"],
                    code=None if code is None else ErrorCode(code),
                )
            )
        return sent, refusals, figures


reaped = pytest.fixture(reaping, name="reaped")


def test_the_double_activation_probe_sees_two_activations_of_one_child_at_once(
    tmp_path: Path,
) -> None:
    provider = ExclusiveSteppingProvider(Clock(), seed=SEED, locks=tmp_path)
    provider._enter("child-a")
    provider._enter("child-b")
    assert provider.overlaps == []
    provider._enter("child-a")  # what a second runtime's activation would do
    assert provider.overlaps == ["child-a"]
    provider._leave("child-a")
    provider._leave("child-a")
    provider._enter("child-a")  # both ended: the lock is free again
    assert provider.overlaps == ["child-a"]


@dataclass
class Reports:
    """What the worker processes reported, merged."""

    runtime_of: dict[str, str]  # worker name -> its runtime id
    sent: list[Sent] = field(default_factory=list)
    refusal_of: dict[str, str] = field(default_factory=dict)  # text -> refusal message
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # worker name -> figures
    closing_at: datetime | None = None  # when the workers were told to close

    def sender_runtime(self, message: Sent) -> str:
        """The runtime that sent ``message`` (its text starts with the worker's name)."""
        return self.runtime_of[message.text.split(" ", 1)[0]]

    def total(self, figure: str) -> int:
        return sum(int(f[figure]) for f in self.figures.values())


def idle_children(url: str, workdir: Path) -> tuple[ExclusiveSteppingProvider, list[str], str]:
    """The shared children, started here and run through their first turns at once (the
    clock is drained), then idle; the provider that ran them (its lock probe), their ids,
    and the runtime that ran them. Makes ``workdir/locks``, the probe's folder."""
    (workdir / "locks").mkdir()
    with SubagentControl.open(url) as control:
        clock = Clock()
        clock.drain()
        setup = ExclusiveSteppingProvider(clock, seed=SEED, locks=workdir / "locks")
        control.providers.register(setup)
        parent = control.agents.register(PARENT)
        children, first = start_children(control, parent, CHILDREN)
        for task_id in first.values():
            control.tasks.wait(task_id, timeout=SETTLE_S, requester=parent)
        return setup, children, control.runtime_id


def run_workers(
    urls: list[str],
    children: list[str],
    sends: int,
    workdir: Path,
    reaped: Reaper,
    *,
    during: Callable[[], None] | None = None,
    env: Mapping[str, str] | None = None,
    prefixes: Sequence[Sequence[str]] | None = None,
) -> tuple[Reports, float]:
    """Run the load in one worker per URL at once (worker ``p<i>`` opens ``urls[i]``, run
    under ``prefixes[i]``, e.g. in a network namespace); their reports and the sending
    time. ``during`` runs here once every worker was told to go, before the test waits for
    them to have sent (a fault schedule)."""
    runs_in = prefixes if prefixes is not None else [()] * len(urls)
    workers = [
        reaped.add(
            Worker(url, f"p{index}", children, sends, workdir, SEED + index, env=env, prefix=prefix)
        )
        for index, (url, prefix) in enumerate(zip(urls, runs_in, strict=True))
    ]
    reports = Reports({worker.name: worker.expect("ready ", READY_S) for worker in workers})
    go = time.monotonic()
    for worker in workers:
        worker.say("go")
    if during is not None:
        during()
    for worker in workers:
        assert worker.next_line(SEND_S) == "sent", worker.stderr()
    sending_s = time.monotonic() - go
    reports.closing_at = datetime.now(UTC)
    for worker in workers:  # only now: until every process has sent, each serves the others
        worker.say("close")
    for worker in workers:
        assert worker.next_line(SETTLE_S * 2) == "closed", worker.stderr()
        assert worker.proc.wait(10) == 0, worker.stderr()
        sent, refusals, reports.figures[worker.name] = worker.report()
        reports.sent.extend(sent)
        reports.refusal_of.update(refusals)
    return reports, sending_s


def stored_once(sent: list[Sent], events: list[SessionEvent]) -> dict[str, int]:
    """Lost, duplicated and refused-but-stored messages, counted straight from the stored
    inbound events (`account` fails each as a violation too), and the forwarded records."""
    inbound = [
        event
        for event in events
        if event.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
        and isinstance(event.data, dict)
    ]
    stored = Counter(str(event.data["text"]) for event in inbound)
    opened = {
        event.data["task_id"]
        for event in events
        if event.kind == EventKind.TURN_START and isinstance(event.data, dict)
    }
    delivered = [
        m for m in sent if m.route == "steered" or (m.route == "started" and m.task_id in opened)
    ]
    return {
        "lost": sum(1 for m in delivered if stored[m.text] == 0),
        "duplicated": sum(1 for m in delivered if stored[m.text] > 1),
        "refused_but_stored": sum(1 for m in sent if m.code is not None and stored[m.text]),
        "forwarded_steering_records": sum(
            1
            for event in inbound
            if event.kind == EventKind.STEERING_MESSAGE and event.data.get("forwarded")
        ),
    }


def _crossings(reports: Reports, tasks: dict[str, TaskSnapshot]) -> dict[str, int]:
    """How often a call reached into another process: a steer or a kill of a Task running
    there, a refusal naming another runtime (given there after forwarding, PostgreSQL; or
    naming the holder, SQLite), and a `started` Task running elsewhere (never)."""

    def elsewhere(message: Sent) -> bool:
        assert message.task_id is not None
        return tasks[message.task_id].runtime_id != reports.sender_runtime(message)

    def names_another(message: Sent) -> bool:
        refusal = reports.refusal_of.get(message.text, "")
        mine = reports.sender_runtime(message)
        return any(r in refusal for r in reports.runtime_of.values() if r != mine)

    sent = reports.sent
    return {
        "steered_in_another_process": sum(1 for m in sent if m.route == "steered" and elsewhere(m)),
        "started_in_another_process": sum(1 for m in sent if m.route == "started" and elsewhere(m)),
        "refused_naming_another_process": sum(
            1 for m in sent if m.code is not None and names_another(m)
        ),
        "kills_of_a_task_in_another_process": sum(
            1
            for f in reports.figures.values()
            for task_id in f["killed"]
            if tasks[task_id].runtime_id != f["runtime_id"]
        ),
    }


@pytest.mark.timeout(180)
def test_concurrent_sends_from_several_processes_are_each_delivered_once_or_refused(
    store_url: str, tmp_path: Path, reaped: Reaper
) -> None:
    url, backend = store_url, backend_of(store_url)
    sends = SENDS_PER_THREAD[backend]
    began = time.monotonic()
    setup, children, setup_runtime = idle_children(url, tmp_path)

    reports, sending_s = run_workers([url] * PROCESSES, children, sends, tmp_path, reaped)

    # On SQLite a send to a child another process runs is refused (OWNERSHIP_CONFLICT); on
    # PostgreSQL it is forwarded and may be refused there (NOT_DELIVERED).
    refusals = {ErrorCode.NOT_DELIVERED}
    if backend == "sqlite":
        refusals.add(ErrorCode.OWNERSHIP_CONFLICT)
    with SubagentControl.open(url) as control:  # the store, as the next process reads it
        assert control.store is not None
        parent = control.agents.register(PARENT)
        tasks = {task.id: task for task in control.store.ledger.owned_by(PARENT)}
        # `account` reads only the children and what was sent of a `Load`.
        load = Load(control, parent, setup, children, 0, {}, sent=reports.sent)
        tally, violations = account(control.store, load, tasks, frozenset(refusals))
        events = [e for child_id in children for e in control.store.load(child_id).events]
    elapsed = time.monotonic() - began

    stored = stored_once(reports.sent, events)
    crossings = _crossings(reports, tasks)
    figures = reports.figures.values()
    overlaps = setup.overlaps + [child for f in figures for child in f["overlaps"]]
    errors = [error for f in figures for error in f["errors"]]
    runtimes_per_child = [
        len({t.runtime_id for t in tasks.values() if t.child_id == child} - {setup_runtime})
        for child in children
    ]
    kills: Counter[str] = Counter()
    kill_refusals: Counter[str] = Counter()
    for f in figures:
        kills.update(f["kills_by_phase"])
        kill_refusals.update(f["kill_refusals"])
    statuses = Counter(task.status.value for task in tasks.values())
    tally["tasks"] = len(tasks)
    write_summary(
        "stress_processes",
        backend,
        {
            "seed": SEED,
            "processes": PROCESSES,
            "threads_per_process": THREADS,
            "children": CHILDREN,
            "backend": backend,
            "elapsed_s": round(elapsed, 2),
            "sending_s": round(sending_s, 2),
            "messages_sent": len(reports.sent),
            "steered": tally["delivered/steered"],
            "started": tally["delivered/started"],
            "started_killed": tally["started/killed"],
            "refused": {
                key.removeprefix("refused/"): value
                for key, value in sorted(tally.items())
                if key.startswith("refused/")
            },
            **stored,
            **crossings,
            "double_activations": len(overlaps),
            "max_live_activations_per_child_in_one_process": max(
                f["max_live_activations_per_child"] for f in figures
            ),
            "activations_entered": reports.total("activations_entered"),
            "activations_entered_per_process": {
                name: f["activations_entered"] for name, f in sorted(reports.figures.items())
            },
            "runtimes_that_ran_each_child": sorted(runtimes_per_child),
            "kills_issued": sum(kills.values()),
            "kills_refused": dict(kill_refusals),
            "task_statuses": dict(sorted(statuses.items())),
            "counts": dict(sorted(tally.items())),
            "violations": len(violations),
        },
    )

    assert errors == [], errors
    assert (stored["lost"], stored["duplicated"], stored["refused_but_stored"]) == (0, 0, 0)
    unexpected = sorted(
        {
            reports.refusal_of.get(m.text, "")
            for m in reports.sent
            if m.code not in {None, *refusals}
        }
    )
    assert violations == [], (violations[:20], unexpected[:10])
    assert overlaps == [], overlaps  # no two activations of a child at once, anywhere
    assert all(f["max_live_activations_per_child"] <= 1 for f in figures)
    assert reports.total("live_at_close") == 0
    assert tally["sent"] == PROCESSES * THREADS * sends
    # A follow-up resumes the child where it was sent, never in another runtime.
    assert crossings["started_in_another_process"] == 0
    # Every Task is settled, and none was interrupted: every runtime stayed alive.
    assert all(task.status.is_terminal for task in tasks.values())
    assert statuses[TaskStatus.INTERRUPTED.value] == 0
    # One Task per child's first turn and per `started` reply: a steer made no second Task.
    assert len(tasks) == CHILDREN + sum(1 for s in reports.sent if s.route == "started")
    # The workload reached across processes: children ran in several runtimes, and both
    # routes and refusals happened.
    assert max(runtimes_per_child) > 1, runtimes_per_child
    assert tally["delivered/steered"] > 0
    assert tally["delivered/started"] > 0
    assert tally["refused/NOT_DELIVERED"] > 0
    if backend == "postgres":
        assert crossings["steered_in_another_process"] > 0  # forwarded and steered there
        # ... each recorded as forwarded, and no forwarded record without its `steered`.
        assert stored["forwarded_steering_records"] == crossings["steered_in_another_process"]
    else:
        assert crossings["steered_in_another_process"] == 0  # SQLite does not forward
        assert tally["refused/OWNERSHIP_CONFLICT"] > 0
        # ... each naming the runtime that holds the child (SPEC §9).
        assert crossings["refused_naming_another_process"] == tally["refused/OWNERSHIP_CONFLICT"]
