"""A budget shared by siblings running at once in two runtimes (two OS processes) on one
store, PostgreSQL or a SQLite file (SPEC §11): the spend is counted atomically in the store,
so no call is lost from the total, and the total passes the limit by at most one model call
per activation running at that moment. On SQLite each runtime's writer works out the rows
it leaves for its gates from its own counting while the other has not committed: the race
is what would show it missing the other's spend.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.contract import usage_of
from persistence import SqlStore
from tests.reliability.budget_child import PARENT, SPEND
from tests.reliability.processes import LinesProcess, Reaper, reaping

SCRIPT = Path(__file__).with_name("budget_child.py")
PROCESSES = 2
CHILDREN = 3  # per process: six siblings running at once
LIMIT = 400
READY_S = 45.0
RUN_S = 90.0

reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def race_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(race_url: str) -> Iterator[SqlStore]:
    with SqlStore(race_url) as opened:  # the schema exists before the workers race to it
        yield opened


@pytest.mark.slow  # measured: 14 s under load (--durations)
def test_siblings_in_two_processes_never_spend_past_a_shared_budget_by_more_than_one_call_each(
    race_url: str, store: SqlStore, reaped: Reaper, tmp_path: Path
) -> None:
    workers = []
    for n in range(PROCESSES):
        args = (race_url, f"w{n}", str(CHILDREN), str(LIMIT))
        worker = LinesProcess(SCRIPT, *args, name=f"worker-{n}", stderr=tmp_path / f"w{n}.err")
        workers.append(reaped.add(worker))
    for worker in workers:
        worker.expect("ready", READY_S)
    for worker in workers:  # as close to at once as two pipes allow
        worker.say("go")

    tasks: dict[str, tuple[str, str]] = {}
    for worker in workers:
        while (line := worker.next_line(RUN_S)) != "done":
            _task, child_id, status, code = line.split()
            tasks[child_id] = (status, code)
    for worker in workers:
        worker.say("close")
        worker.expect("closed", READY_S)

    assert len(tasks) == PROCESSES * CHILDREN
    # Every one ran until the shared budget stopped it (the model calls a tool for ever).
    assert set(tasks.values()) == {("failed", "BUDGET_EXHAUSTED")}, tasks
    spent = {child_id: usage_of(store.load(child_id).own_events) for child_id in tasks}
    total = sum(usage.total_tokens for usage in spent.values())
    running = PROCESSES * CHILDREN
    # Each activation may start one call within the limit that ends past it, no more.
    assert LIMIT <= total <= LIMIT + running * SPEND, (total, spent)
    assert all(usage.model_calls >= 1 for usage in spent.values()), spent
    # The counter in the store is the sum of what the transcripts record: no lost update.
    (row,) = store.spend.read([f"session:{PARENT}"]).values()
    assert row.spent.tokens == total
    assert row.spent.model_calls == sum(usage.model_calls for usage in spent.values())
