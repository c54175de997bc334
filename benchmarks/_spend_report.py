"""The text of the "Usage and budgets" section (`benchmarks.spend`)."""

from __future__ import annotations

from typing import Any

from benchmarks._report import table
from benchmarks._stats import Spread, fmt_ratio, fmt_s

__all__ = ["body"]

_APPEND_GOAL = 1.05
_GATE_GOAL = 1.1


def body(config: Any, figures: dict[str, dict[str, dict[str, Spread]]], skipped: str | bool) -> str:
    """The section's Markdown: method, verdicts, one table per measure."""
    steer_rows, append_rows, turn_rows = [], [], []
    steer_ok, append_ok, gate_ok = True, True, True
    for backend, by in figures.items():
        steer = by["steer"]
        noise = steer["plain again/plain"]
        cost = steer["budgets/plain"]
        # "Nothing, within noise": the budgets' ratio stays inside the A/A pair's range,
        # widened to 1 (a noise floor is at least no difference).
        steer_ok &= min(noise.low, 1.0) <= cost.median <= max(noise.high, 1.0)
        steer_rows.append(
            [backend, fmt_s(steer["plain"]), fmt_ratio(noise), fmt_s(steer["budgets"]),
             fmt_ratio(cost)]
        )  # fmt: skip
        append = by["append"]
        for mode in ("bare", "bare again", "recorded", "usage", "budget", "priced"):
            ratio = append[f"{mode}/bare"]
            if mode in ("budget", "priced"):
                append_ok &= ratio.median <= _APPEND_GOAL
                gate_ok &= ratio.median <= _GATE_GOAL
            extra = fmt_s(
                Spread(
                    append[mode].median - append["bare"].median,
                    append[mode].low - append["bare"].low,
                    append[mode].high - append["bare"].high,
                    1,
                )
            )
            gate_only = append.get(f"{mode}/recorded")
            append_rows.append(
                [backend, mode, fmt_s(append[mode]), fmt_ratio(ratio),
                 "" if mode == "bare" else extra,
                 fmt_ratio(gate_only) if gate_only is not None and mode in _GATED else ""]
            )  # fmt: skip
        turn = by["turn"]
        turn_rows.append(
            [backend, fmt_s(turn["plain"]), fmt_s(turn["budgets"]),
             fmt_ratio(turn["budgets/plain"])]
        )  # fmt: skip
    steer_verdict = "met" if steer_ok else "**not met**"
    append_verdict = "met" if append_ok else "**not met**"
    gate_verdict = "met" if gate_ok else "**not met**"
    lines = [
        "What usage recording and budgets cost (issue 26). Every ratio is taken inside each "
        f"round, the modes interleaved; {config.rounds} rounds; a figure is the median of the "
        "rounds' p50, with the rounds' min–max.",
        "",
        f"**Steer** — goal: a steer pays nothing for budgets (within noise) — {steer_verdict}. "
        "Two control planes on the same backend: **plain** has no budgets (every run still "
        "gets a gate, which nothing limits), **budgets** has a session budget and each child "
        f"a budget of its own, none reached. {config.live_per_mode} live children per pool, "
        f"{config.steer_ops} steers per pool per round, call by call; **plain again** is a "
        "second pool of the plain control plane (the A/A noise floor). A steer never asks "
        "the gate: the budget is read before the child's next model or tool call.",
        "",
        table(
            ["backend", "plain p50", "plain again / plain", "budgets p50", "budgets / plain"],
            steer_rows,
        ),
        "",
        "**Model-call append** — goal: recording usage and checking the budget ≤ "
        f"{_APPEND_GOAL:g}× the model-call append it rides with — {append_verdict} (judged "
        "on **budget** and **priced**). Through a live, published activation's own "
        "transcript writer and gate (a benchmark provider keeps them from its "
        "`StartRequest`), what the agent loop does around a model call, "
        f"{config.append_ops} calls per mode per round, call by call: **bare** appends the "
        "`assistant/message` of a reply without usage and asks no gate (the append as it "
        "was before usage and budgets; the baseline), **bare again** the same on a second "
        "child (A/A), **recorded** appends the reply with its usage (counted in the ledger "
        "for the child and its session in the append's transaction) and asks no gate, "
        "**usage** asks the gate (`check(MODEL_CALL)`, no budget on any "
        "scope: it checks the child's and the session's ledger rows) and appends as "
        "**recorded**, **budget** the same for a child with a budget, **priced** "
        "the same for a child whose model has a price (the cost computed before the write) "
        "and a cost limit. A run's gate reads the counters once per turn: each append "
        "that records a call's spend returns its scopes' rows, which the next check uses "
        "(here every check finds the previous call's append's rows). Issue 39's goal, the "
        f"budget gate ≤ {_GATE_GOAL:g}× the bare append: {gate_verdict} (same judges). "
        "**/ recorded** is the gate's own share: each gated mode over **recorded**, which "
        "writes the same event and counts the same spend with no gate asked.",
        "",
        table(
            ["backend", "mode", "gate + append p50", "/ bare", "− bare", "/ recorded"],
            append_rows,
        ),
        "",
        f"**Turn** — what a user feels: a resume of an idle child until its Task completes, "
        f"the turn making {_CALLS_TEXT} (an instant `ScriptedModel` reporting usage, 9 "
        "of its replies calling one tool: 10 model-call gates and appends, 9 tool-call "
        "gates and 18 tool events). **plain** has no budgets, **budgets** a session budget "
        f"and child budgets; {config.turns} turns of each per round, alternating, "
        f"{config.turn_children} children per side in rotation.",
        "",
        table(["backend", "plain p50", "budgets p50", "budgets / plain"], turn_rows),
    ]
    if skipped:
        lines += ["", f"PostgreSQL: {skipped}."]
    return "\n".join(lines)


_CALLS_TEXT = "10 model calls"
_GATED = ("usage", "budget", "priced")
