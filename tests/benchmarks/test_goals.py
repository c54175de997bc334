"""The goals table's rows: a verdict computed from the figures, a cause shown on a miss
only, a missing figure said so, and each row naming the run its figures came from.

No timing here: the figures are made up, the logic that judges them is what is tested.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks._goals import (
    GOALS,
    NOT_MEASURED,
    Goal,
    Reading,
    goal_row,
    goals_section,
    record_figures,
)
from benchmarks._report import Section

_IMPORT = next(goal for goal in GOALS if goal.goal.startswith("`from controlplane"))
_FIGURES = {
    "start-up wall s: from controlplane import SubagentControl": 0.064,
    "start-up CPU s: from controlplane import SubagentControl": 0.061,
    "start-up wall s: python -c pass": 0.029,
}
_HERE = {"imports": "this run"}


def test_a_figure_within_the_goal_is_met_and_shows_no_cause() -> None:
    goal, figure, verdict, cause, source = goal_row(_IMPORT, _FIGURES, _HERE)

    assert goal == _IMPORT.goal
    assert figure.startswith("64 ms wall, 61 ms CPU")
    assert verdict == "met"
    assert cause == ""
    assert source == "this run"


def test_a_figure_past_the_goal_is_not_met_and_shows_the_kept_cause_and_this_runs_numbers() -> None:
    slow = {**_FIGURES, "start-up wall s: from controlplane import SubagentControl": 0.251}

    _, figure, verdict, cause, _ = goal_row(_IMPORT, slow, _HERE)

    assert figure.startswith("251 ms wall")
    assert verdict == "**not met**"
    assert cause.startswith(_IMPORT.cause)
    assert "This run: `python -c pass` took 29 ms wall" in cause


def test_a_missing_figure_is_not_measured_and_names_the_section_that_measures_it() -> None:
    _, figure, verdict, cause, source = goal_row(_IMPORT, {}, {})

    assert figure.startswith(NOT_MEASURED)
    assert "`python -m benchmarks --sections imports`" in figure
    assert verdict == "not measured"
    assert cause == ""
    assert source == "no run"


def test_a_before_after_goal_is_not_judged_by_one_run_and_names_its_command() -> None:
    goal = Goal("as fast as before", ("routing",), lambda f: Reading(f"{f['x']}"), "slow", "CMD")

    _, figure, verdict, cause, _ = goal_row(goal, {"x": 1.0}, {"routing": "this run"})

    assert figure == "1.0"
    assert verdict == "not judged by one run: `CMD`"
    assert cause == ""


def test_a_goal_with_nothing_to_meet_is_measured_with_no_cause() -> None:
    goal = Goal("a curve", ("scaleout",), lambda f: Reading("drawn"), "never shown")

    assert goal_row(goal, {}, {})[1:4] == ["drawn", "measured", ""]


def test_each_goals_judgement_follows_its_threshold_on_both_sides() -> None:
    throughput = next(goal for goal in GOALS if goal.goal.startswith("steer throughput"))
    figures = {
        "steer p50, 1,000 live": 150e-6,
        "SqlStore.append / sqlite3 append, 1,000 live": 1.4,
    }
    at = {"routing": "this run"}

    ratio = "steer throughput / router, 1,000 live"

    at_goal = goal_row(throughput, {**figures, ratio: 0.5}, at)
    missed = goal_row(throughput, {**figures, ratio: 0.33}, at)

    assert at_goal[2:4] == ["met", ""]
    assert missed[2] == "**not met**"
    assert "steer p50 150 µs at 1,000 live" in missed[3]


def test_a_row_from_two_sections_names_each_sections_run() -> None:
    fronts = next(goal for goal in GOALS if goal.goal.endswith("transport, SQLite"))
    origin = {"fronts": "this run", "a2a": "`python -m benchmarks --sections a2a`, earlier"}

    source = goal_row(fronts, {}, origin)[4]

    assert source == "fronts: this run; a2a: `python -m benchmarks --sections a2a`, earlier"


def test_kept_figures_keep_the_sections_not_run_with_their_run_and_replace_those_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "figures.json"
    first = {
        "imports": Section("x", "", {"figures": _FIGURES}),
        "routing": Section("y", "", {"figures": {"steer p50, 1,000 live": 1.0}}),
    }
    record_figures(path, at="T1", command="python -m benchmarks", quick=False, ran=first)
    skipped = {"imports": Section("x", "PostgreSQL was skipped", {"skipped": True})}

    kept = record_figures(
        path, at="T2", command="python -m benchmarks --sections imports", quick=True, ran=skipped
    )

    assert json.loads(path.read_text())["sections"] == kept
    assert kept["imports"]["figures"] == {}  # nothing of T1's passes for T2's
    assert kept["routing"]["at"] == "T1"
    body = goals_section(kept, at="T2").body
    row = next(line for line in body.splitlines() if line.startswith(f"| {_IMPORT.goal}"))
    assert NOT_MEASURED in row
    assert "this run (quick)" in row
    throughput = next(line for line in body.splitlines() if "steer throughput" in line)
    assert "`python -m benchmarks`, T1" in throughput


def test_every_goal_has_a_cause_for_a_miss_unless_it_has_nothing_to_miss() -> None:
    for goal in GOALS:
        try:
            reading = goal.read({})
        except KeyError:
            reading = None
        assert reading is None  # every goal reads figures of its own
        assert goal.sections
        assert goal.cause or goal.against or goal.goal.startswith(("scale-out", "projected"))
