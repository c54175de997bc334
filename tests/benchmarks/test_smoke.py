"""Smoke test of ``python -m benchmarks --quick``: it runs and writes its tables.

No timing is asserted here: the numbers are the benchmark's output, not a test's verdict.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks import store as bench
from benchmarks._harness import seed_child, sqlite_url
from controlplane import EventKind
from persistence import SqlStore
from persistence._backend import ConnectionSettings, open_engine
from persistence._dialect import dialect_named
from persistence._port import StoreSql
from tests.conftest import PG_URL_ENV, pg_base_url
from tests.support import run_python


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_benchmark_run_writes_a_report_with_every_section_table(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    plot = tmp_path / "resume_latency.png"

    done = run_python(
        "-m", "benchmarks", "--quick", "--out", str(out), "--plot", str(plot), timeout=280
    )

    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text(encoding="utf-8")
    for heading in ("## Routing", "## Cold resume", "## Scale", "## Durable Tasks"):
        assert heading in report, f"{heading} missing from the report"
    assert "| live children | steer p50 |" in report
    assert "| messages |" in report
    assert "| with Task rows | without (baseline) |" in report
    assert "| settled Tasks | `tasks.get` p50 |" in report
    assert "| turns | elapsed | VmRSS | threads | gc-tracked objects | supervisors |" in report
    assert "Quick smoke run" in report
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0
    # The goals table, written from this run's figures (kept beside the report).
    assert "## Issue 39 goals" in report
    assert "| goal | figure | verdict | cause of a miss | from |" in report
    goals = report.split("## Issue 39 goals", 1)[1].split("\n## ", 1)[0]
    for goal in (
        "`from controlplane import SubagentControl` ≤ 250 ms",
        "warm resume ≤ 4 transactions, cold ≤ 4, steer 1",
        "a whole scripted turn ≤ 1.5 ms p50 on SQLite",
        "an idle live child ≤ 16 KiB and 0 threads",
        "memory per live child ≤ 64 KiB",
        "RSS flat within 10% after the warm-up",
        "budget gate ≤ 1.1× the bare model-call append, SQLite",
    ):
        row = next(line for line in goals.splitlines() if line.startswith(f"| {goal}"))
        assert "not measured" not in row, row
        assert row.endswith("| this run (quick) |"), row
    # A quick run steers no 1,000 live children: the row says so rather than guess.
    assert "| steer throughput ≥ 0.5× the lock+dict router at 1,000 live | not measured" in goals
    assert (tmp_path / "benchmark-figures.json").exists()
    if importlib.util.find_spec("opentelemetry") and importlib.util.find_spec("opentelemetry.sdk"):
        assert "| path | off p50 | off again / off | api p50 |" in report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_soak_run_counts_idle_children_and_samples_a_churning_run(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"

    done = run_python(
        "-m", "benchmarks", "--quick", "--sections", "soak", "--out", str(out), timeout=280
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text(encoding="utf-8")
    assert "## Idle children and soak" in report
    assert "| per idle child |" in report
    assert "| turns | elapsed | VmRSS | threads | gc-tracked objects | supervisors |" in report
    assert "Goal: flat within 10% after" in report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_forwarding_run_times_a_forwarded_steer_and_takeovers_on_postgresql(
    tmp_path: Path,
) -> None:
    url = pg_base_url()
    if url is None:
        pytest.skip(f"forwarding runs on PostgreSQL: set {PG_URL_ENV} to a reachable server")
    out = tmp_path / "benchmarks.md"

    done = run_python(
        "-m", "benchmarks", "--quick", "--sections", "forwarding", "--out", str(out),
        timeout=280,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text(encoding="utf-8")
    assert "## Forwarding across processes" in report
    assert "| forwarded steer (B → A → B) |" in report
    assert "| forwarded / baseline |" in report
    assert "| this host |" in report
    assert "| another host (emulated) |" in report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_scaleout_run_draws_its_curve_and_counts_commits_per_operation(
    tmp_path: Path,
) -> None:
    url = pg_base_url()
    if url is None:
        pytest.skip(f"scale-out runs on PostgreSQL: set {PG_URL_ENV} to a reachable server")
    out = tmp_path / "benchmarks.md"
    plot = tmp_path / "resume_latency.png"

    done = run_python(
        "-m", "benchmarks", "--quick", "--sections", "scaleout", "--out", str(out),
        "--plot", str(plot), timeout=280,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text(encoding="utf-8")
    assert "## Scale-out on one PostgreSQL" in report
    assert "| 2 | forwarded steers |" in report
    assert "| operation | projected /s | commits / op | against DBOS |" in report
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra draws it
        assert (tmp_path / "scaleout.png").stat().st_size > 0


def test_an_unknown_section_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"

    done = run_python("-m", "benchmarks", "--sections", "nope", "--out", str(out), timeout=60)

    assert done.returncode != 0
    assert "unknown section" in done.stderr
    assert not out.exists()


def test_a_seeded_child_is_written_in_the_batches_a_real_child_is(tmp_path: Path) -> None:
    with SqlStore(sqlite_url(tmp_path / "seed.db")) as store:
        child_id = seed_child(store, 10)  # two turns: a user message, four answers
        events = store.load(child_id).events

    frame = [EventKind.TURN_START, EventKind.USER_MESSAGE]
    assistant = [EventKind.ASSISTANT_MESSAGE] * 4
    assert [e.kind for e in events] == [
        *frame, EventKind.DESCRIPTOR, *assistant, EventKind.TURN_END,
        *frame, *assistant, EventKind.TURN_END,
    ]  # fmt: skip
    assert [e.turn for e in events] == [1] * 8 + [2] * 7
    # One write per frame, per answer and per turn end: 12 distinct write times.
    assert len({e.created_at for e in events}) == 12
    assert events[0].created_at == events[2].created_at != events[3].created_at


@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://nobody@localhost/db"])
def test_the_store_benchmarks_raw_side_runs_the_stores_own_statements(url: str) -> None:
    # The statements the store runs on each backend (no connection is made).
    settings = ConnectionSettings(lock_timeout_s=5, statement_timeout_s=30, durable_os_crash=False)
    engine, backend = open_engine(url, settings)
    engine.dispose()
    ours = StoreSql.build(dialect_named(backend.name)).children
    raw = bench.store_statements("?" if backend.name == "sqlite" else "%s")
    for name in ("header", "events", "load", "last_seq", "insert", "lock_child"):
        assert getattr(raw, name) == getattr(ours, name), name
    assert (ours.lock_child is not None) is (backend.name == "postgresql")
