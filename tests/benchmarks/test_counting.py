"""The benchmark's counters (`benchmarks._counting`) and ``--against``: hand-offs are
counted, not estimated, so the counts themselves are tested here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pykka
import pytest

from benchmarks._counting import counting
from benchmarks._harness import sqlite_url
from controlplane import ChildMeta, NewEvent
from persistence import SqlStore
from tests.support import REPO, run_python


class _Echo(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return message

    def ping(self) -> str:
        return "pong"


def test_counting_groups_statements_into_labelled_transactions(tmp_path: Path) -> None:
    with counting() as counts, SqlStore(sqlite_url(tmp_path / "counted.db")) as store:
        store.create_child(ChildMeta(child_id="c1", parent_session="p", depth=1))
        before = counts.snapshot()
        # Two events: a batch is a transaction of several statements (one event is one).
        store.append("c1", [NewEvent(kind="user/message", turn=1, data={"n": n}) for n in (1, 2)])
        store.load("c1")
        done = counts.since(before)

    # The append is one write transaction; the load one statement outside any, which
    # SQLite runs as a transaction of its own.
    assert done.transactions == Counter({"write: events": 1, "read: children, events, segments": 1})
    assert done.writes == 1
    assert done.total_transactions == 2
    assert done.statements == 4  # the append's tail and two inserts, the load's select
    begins = [what for _at, what in done.timeline if what.startswith("begin")]
    assert begins == ["begin write: events"]


def test_counting_counts_each_tell_and_ask_and_names_proxy_calls() -> None:
    original_tell, original_ask = pykka.ActorRef.tell, pykka.ActorRef.ask
    echo = _Echo.start()
    try:
        with counting() as counts:
            echo.tell("fire")
            assert echo.ask("hello", timeout=5) == "hello"
            assert echo.proxy().ping().get(timeout=5) == "pong"
    finally:
        echo.stop()

    assert counts.messages == Counter(
        {"tell _Echo str": 1, "ask _Echo str": 1, "ask _Echo.ping": 1}
    )
    assert (counts.tells, counts.asks, counts.hops) == (1, 2, 5)
    # The wrappers are gone once the block ends.
    assert (pykka.ActorRef.tell, pykka.ActorRef.ask) == (original_tell, original_ask)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_against_runs_both_trees_and_reports_each_figures_ratio(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"

    done = run_python(
        "-m", "benchmarks", "--against", str(REPO), "--rounds", "2", "--sections", "hops",
        "--quick", "--no-postgres", "--out", str(out), timeout=280,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr.count("this tree") == 2
    assert done.stderr.count("other tree") == 2
    report = out.read_text(encoding="utf-8")
    assert "## Against another tree" in report
    rows = [line for line in report.splitlines() if line.startswith("| actor messages per ")]
    assert len(rows) == 4  # steer, warm resume, a whole scripted turn, cold resume
    # The same code on both sides: every count is the same in both, round by round.
    for row in rows:
        assert row.endswith("| 1.00× (1.00–1.00) |"), row


def _documented_hops() -> dict[str, dict[str, str]]:
    """docs/benchmarks.md's hop and transaction table: each operation's row by column."""
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split("## Hops and transactions", 1)[1].split("\n## ", 1)[0]
    first_table = section.split("\n| ", 1)[1].split("\n\n", 1)[0]
    lines = [line for line in ("| " + first_table).splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_documented_hops_and_transactions_are_what_the_code_does(tmp_path: Path) -> None:
    from benchmarks.hops import HopsConfig, count_operations

    tallies, _steps = count_operations(HopsConfig(steers=10, resumes=4, cold_resumes=2), tmp_path)
    documented = _documented_hops()

    assert {t.name for t in tallies} == set(documented)
    for tally in tallies:
        row = documented[tally.name]
        counts = tally.counts
        # Whole numbers: a lease renewal inside the window adds a fraction.
        counted = {
            "actor messages": round((counts.tells + counts.asks) / tally.ops),
            "cross-thread hops": round(counts.hops / tally.ops),
            "store transactions": round(counts.total_transactions / tally.ops),
            "of which write": round(counts.writes / tally.ops),
        }
        shown = {name: round(float(row[name])) for name in counted}
        assert shown == counted, f"{tally.name}: rerun `python -m benchmarks --sections hops`"
    steer = next(t for t in tallies if t.name == "steer")
    assert steer.counts.total_transactions == steer.ops  # a steer is one transaction
