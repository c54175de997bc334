"""SPEC §5 send_message 2-5 under load: every message is delivered exactly once or refused.

Many threads fire uniquely-texted `send_message` calls (parent and human sources) at a few
children whose runs step forward only when the load ticks them (`stepping.py`), so each child
keeps cycling through starting, running, settling and idle while messages and kills land in
every phase (`load.py`). Afterwards every message is accounted for against the stored
transcripts:

- ``steered``: exactly one ``steering/message`` with its text and source, in the turn of the
  Task the caller was told;
- ``started``: exactly one ``user/message`` opening the turn of the new Task, also when that
  Task was killed before its run was published (its turn then ends ``killed``);
- refused (``NOT_DELIVERED``; ``CLOSED`` once closing): nowhere in any transcript.

The provider counts live activations per child under a lock: never more than one.

Set ``SUBAGENT_CONTROL_RELIABILITY_SUMMARY`` to a file path to get the run's figures as JSON
(docs/reliability.md quotes them); ``SUBAGENT_CONTROL_STRESS_SEED`` picks another workload.
"""

from __future__ import annotations

import threading
import time

import pytest

from controlplane import ErrorCode, SubagentControl
from persistence import SqlStore
from tests.reliability.load import (
    CHILDREN,
    SEED,
    SETTLE_S,
    THREADS,
    Load,
    account,
    start_children,
)
from tests.reliability.stepping import Clock, SteppingProvider
from tests.reliability.summary import backend_of, write_summary

# Sends per sender thread on each backend: sized so the whole test stays within ~30 s.
SENDS_PER_THREAD = {"sqlite": 700, "postgres": 500}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_thousands_of_concurrent_sends_are_each_delivered_once_or_refused_and_never_lost(
    store_url: str,
) -> None:
    url, backend = store_url, backend_of(store_url)
    sends_per_thread = SENDS_PER_THREAD[backend]
    clock = Clock()
    provider = SteppingProvider(clock, seed=SEED)
    began = time.monotonic()
    control = SubagentControl.open(url)
    try:
        control.providers.register(provider)
        parent = control.agents.register("stress-parent")
        children, latest = start_children(control, parent, CHILDREN)
        load = Load(control, parent, provider, children, sends_per_thread, latest)
        load.run()
        assert not load.errors, load.errors
        clock.drain()
        for task in control.tasks.list(parent):
            control.tasks.wait(task.id, timeout=SETTLE_S, requester=parent)
        still_running = [t.id for t in control.tasks.list(parent) if not t.status.is_terminal]
        tasks = {task.id: task for task in control.tasks.list(parent)}
        assert control.store is not None
        tally, violations = account(control.store, load, tasks)
    finally:
        control.close()
    with SqlStore(url) as store:  # the Task rows, as the next process would read them
        after_close = store.ledger.owned_by(parent.session_id)
    elapsed = time.monotonic() - began

    tally["tasks"] = len(tasks)
    summary = {
        "seed": SEED,
        "threads": THREADS,
        "children": CHILDREN,
        "backend": backend,
        "elapsed_s": round(elapsed, 2),
        "max_live_activations_per_child": max(provider.max_live.values()),
        "activations_entered": provider.entered,
        "starts_rolled_back": provider.rollbacks,
        "kills_by_phase": dict(load.kills),
        "counts": dict(sorted(tally.items())),
        "violations": len(violations),
    }
    write_summary("stress", backend, summary)

    assert violations == [], violations[:20]
    assert tally["sent"] == THREADS * sends_per_thread
    assert max(provider.max_live.values()) == 1, provider.max_live
    assert still_running == []
    assert all(task.status.is_terminal and task.outcome for task in after_close)
    # One Task per start and per `started` reply: a steer never made a second Task.
    assert len(tasks) == CHILDREN + sum(1 for s in load.sent if s.route == "started")
    # The workload really reached every phase, and both routes and refusals happened.
    for phase in ("starting", "running", "settling", "idle"):
        assert tally[f"phase/{phase}"] > 0, f"no message was sent while {phase}"
    assert tally["delivered/steered"] > 0
    assert tally["delivered/started"] > 0
    assert tally["refused/NOT_DELIVERED"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_closing_under_load_settles_every_task_and_loses_no_delivered_message(
    sqlite_url: str,
) -> None:
    sends_per_thread = 150
    clock = Clock()
    provider = SteppingProvider(clock, seed=SEED + 1)
    control = SubagentControl.open(sqlite_url)
    closed = threading.Event()

    def close() -> None:
        # Let every provider wait end at once: close() kills and waits for settlement.
        clock.drain()
        control.close()
        closed.set()

    control.providers.register(provider)
    parent = control.agents.register("stress-parent")
    children, latest = start_children(control, parent, CHILDREN)
    halfway = (THREADS * sends_per_thread // 2, close)
    load = Load(control, parent, provider, children, sends_per_thread, latest, at_count=halfway)
    load.run()
    assert closed.wait(SETTLE_S), "close() never returned"
    assert not load.errors, load.errors
    with SqlStore(sqlite_url) as store:  # every Task, from its durable row
        tasks = {task.id: task for task in store.ledger.owned_by(parent.session_id)}
        tally, violations = account(
            store, load, tasks, frozenset({ErrorCode.NOT_DELIVERED, ErrorCode.CLOSED})
        )
    write_summary(
        "close_under_load",
        "sqlite",
        {"counts": dict(sorted(tally.items())), "violations": len(violations)},
    )

    assert violations == [], violations[:20]
    assert all(task.status.is_terminal for task in tasks.values())
    assert tally["refused/CLOSED"] > 0  # the close really landed among the sends
    assert tally["delivered/steered"] + tally["delivered/started"] > 0
    assert max(provider.max_live.values()) == 1
    assert provider.live_total() == 0  # every run was disposed before close() returned
