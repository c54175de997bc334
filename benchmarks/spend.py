"""Usage and budgets (issue 26): what they cost a steer, a model call's append and a turn,
ratios measured in the same run.

- Steer (goal: nothing, within noise): two control planes on the same backend, one with
  no budgets (the store's default: every run still has a gate, which nothing limits), one
  with a session budget, each child started with a budget of its own; none is reached.
  The plain one steers two pools of live children (``plain`` and ``plain again``: the A/A
  noise floor), the other one pool; the three take turns call by call.
- Model-call append (goal: recording usage and checking the budget ≤ 1.05× the append;
  issue 39: the budget gate ≤ 1.1× the bare append):
  see `benchmarks._spend_appends`.
- Turn (what a user feels): a resume of an idle child whose turn makes 10 model calls
  (an instant `ScriptedModel` reporting usage; 9 of the replies call one tool) until its
  Task completes, on a control plane with no budgets against one with a session budget
  and child budgets; the two alternate turn by turn.

SQLite, and PostgreSQL when reachable.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._harness import frozen_gc, pg_schema, sqlite_url
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from benchmarks._report import Section
from benchmarks._spend_appends import APPEND_MODES, time_appends
from benchmarks._spend_report import body
from benchmarks._stats import Spread, percentile, sample_interleaved, spread
from controlplane import (
    AgentHandle,
    Budget,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.models import ModelReply, ToolCall

__all__ = ["SpendConfig", "run_spend"]

_PARENT = "bench-spend"
_MESSAGE = [TextBlock(text="Also check the migration for the events table; keep seq gapless.")]
_SOURCE = MessageSource(kind="coordinator", sender_session_id=_PARENT)
_STEER_MODES = ("plain", "plain again", "budgets")
_ROOMY = Budget(tokens=10**15, model_calls=10**12, tool_calls=10**12, seconds=10**9)
_CALLS = 10
_LOOK = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])
_TURN: list[str | ModelReply] = [*([_LOOK] * (_CALLS - 1)), "done"]
_USAGE = Usage(input_tokens=1_800, output_tokens=120)
_WAIT_S = 60.0


@dataclass(frozen=True)
class SpendConfig:
    """How much to measure."""

    live_per_mode: int = 30
    rounds: int = 7
    steer_ops: int = 400
    append_ops: int = 400
    turn_children: int = 4
    turns: int = 20

    @classmethod
    def quick(cls) -> SpendConfig:
        """A smoke run: small, seconds."""
        return cls(live_per_mode=4, rounds=2, steer_ops=30, append_ops=30, turns=3)


def run_spend(config: SpendConfig, workdir: Path, pg_url: str | None, pg_note: str) -> Section:
    """Measure the steer, the model-call append and the turn, per backend."""
    figures: dict[str, dict[str, dict[str, Spread]]] = {}
    backends: list[tuple[str, Callable[[str], Any]]] = [
        ("SQLite", lambda name: _sqlite(workdir, name))
    ]
    if pg_url is not None:
        backends.append(("PostgreSQL", lambda _name: pg_schema(pg_url)))
    for backend, url_of in backends:
        with frozen_gc():
            figures[backend] = {
                "steer": _summary(_steers(config, url_of), "plain"),
                "append": _summary(_appends(config, url_of), "bare", "recorded"),
                "turn": _summary(_turns(config, url_of), "plain"),
            }
    return Section(
        "Usage and budgets",
        body(config, figures, pg_url is None and pg_note),
        {"figures": figures},
    )


@contextmanager
def _sqlite(workdir: Path, name: str) -> Iterator[str]:
    yield sqlite_url(workdir / f"spend-{name}.db")


def _summary(p50: dict[str, list[float]], *bases: str) -> dict[str, Spread]:
    """Each mode's p50 across rounds, and its ratio to each of ``bases`` taken inside
    each round."""
    out = {mode: spread(values) for mode, values in p50.items()}
    for base in bases:
        for mode, values in p50.items():
            ratios = [v / b for v, b in zip(values, p50[base], strict=True)]
            out[f"{mode}/{base}"] = spread(ratios)
    return out


# -- steer -------------------------------------------------------------------------------------


def _steers(config: SpendConfig, url_of: Callable[[str], Any]) -> dict[str, list[float]]:
    p50: dict[str, list[float]] = {m: [] for m in _STEER_MODES}
    rng = random.Random(26)
    with ExitStack() as stack:
        plain_url = stack.enter_context(url_of("steer-plain"))
        budget_url = stack.enter_context(url_of("steer-budgets"))
        plain = _Live(plain_url)
        stack.callback(plain.close)
        limited = _Live(budget_url, session_budget=_ROOMY)
        stack.callback(limited.close)
        pools = {
            "plain": plain.grow(config.live_per_mode, None),
            "plain again": plain.grow(config.live_per_mode, None),
            "budgets": limited.grow(config.live_per_mode, _ROOMY),
        }
        sides = {"plain": plain, "plain again": plain, "budgets": limited}
        steer = {m: partial(sides[m].steer, pools[m], rng) for m in _STEER_MODES}
        for _ in range(config.rounds):
            for mode, timed in sample_interleaved(steer, config.steer_ops, chunk=1).items():
                p50[mode].append(percentile(timed, 50))
    return p50


class _Live:
    """A control plane whose children stay live (the bench provider's runs block)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.control = SubagentControl.open(url, **options)
        self.provider = BenchProvider()
        self.control.providers.register(self.provider)
        self.parent = self.control.agents.register(_PARENT)

    def grow(self, count: int, budget: Budget | None) -> list[str]:
        started = [
            self.control.start_continuable(
                ContinuableStartSpec(
                    provider=PROVIDER_NAME, label="bench", prompt=[TextBlock(text="go")],
                    parent=self.parent, budget=budget,
                )
            ).child_id
            for _ in range(count)
        ]  # fmt: skip
        for child_id in started:  # returns once published and delivered
            self.steer([child_id], random.Random(0))
        return started

    def steer(self, pool: list[str], rng: random.Random) -> None:
        sent = self.control.send_message(self.parent, rng.choice(pool), _MESSAGE, _SOURCE)
        if sent.route != "steered":
            raise AssertionError("expected a steer")

    def close(self) -> None:
        self.provider.release_all()
        self.control.close()


# -- model-call append -------------------------------------------------------------------------


def _appends(config: SpendConfig, url_of: Callable[[str], Any]) -> dict[str, list[float]]:
    with url_of("appends") as url:
        samples = time_appends(url, config.rounds, config.append_ops)
    return {mode: samples.p50[mode] for mode in APPEND_MODES}


# -- turn ---------------------------------------------------------------------------------------


def _turns(config: SpendConfig, url_of: Callable[[str], Any]) -> dict[str, list[float]]:
    """Per round, the p50 of a whole turn of `_CALLS` model calls, budgets off and on."""
    per_side = config.turn_children * (1 + config.rounds * config.turns)
    p50: dict[str, list[float]] = {"plain": [], "budgets": []}
    with ExitStack() as stack:
        sides = {
            "plain": _Turns(stack.enter_context(url_of("turn-plain")), per_side, {}, None),
            "budgets": _Turns(
                stack.enter_context(url_of("turn-budgets")),
                per_side,
                {"session_budget": _ROOMY},
                _ROOMY,
            ),
        }
        for side in sides.values():
            stack.callback(side.close)
            side.warm(config.turn_children)
        for _ in range(config.rounds):
            timed: dict[str, list[float]] = {m: [] for m in sides}
            for i in range(config.turns):
                order = list(sides) if i % 2 == 0 else list(reversed(sides))
                for mode in order:
                    timed[mode].append(sides[mode].turn())
            for mode, values in timed.items():
                p50[mode].append(percentile(values, 50))
    return p50


class _Turns:
    """A control plane whose children each run a turn of `_CALLS` model calls per send."""

    def __init__(self, url: str, turns: int, options: dict[str, Any], budget: Budget | None):
        # One script for every turn this side will run, in order (its calls are counted
        # across children, and each turn ends before the next starts).
        self._model = ScriptedModel(_TURN * turns, usage=_USAGE)
        look = ChildTool("look", "Look around.", {"type": "object"}, lambda _args: "seen")
        self.control = SubagentControl.open(url, **options)
        self.control.providers.register(InProcessProvider(self._model, tools=[look]))
        self.parent: AgentHandle = self.control.agents.register(_PARENT)
        self._budget = budget
        self._children: list[str] = []
        self._next = 0

    def warm(self, count: int) -> None:
        for _ in range(count):
            started = self.control.start_continuable(
                ContinuableStartSpec(
                    provider="inprocess", label="turns", prompt=[TextBlock(text="go")],
                    parent=self.parent, budget=self._budget,
                )
            )  # fmt: skip
            self._wait(started.task_id)
            self._children.append(started.child_id)

    def turn(self) -> float:
        child_id = self._children[self._next % len(self._children)]
        self._next += 1
        calls = self._model.call_count
        t0 = time.perf_counter()
        sent = self.control.send_message(self.parent, child_id, _MESSAGE, _SOURCE)
        self._wait(sent.task_id)
        took = time.perf_counter() - t0
        if self._model.call_count - calls != _CALLS:
            raise AssertionError(f"a turn made {self._model.call_count - calls} model calls")
        return took

    def _wait(self, task_id: str) -> None:
        done = self.control.tasks.wait(task_id, timeout=_WAIT_S, requester=self.parent)
        if done.status is not TaskStatus.COMPLETED:
            raise AssertionError(f"a bench turn ended {done.status}: {done.outcome}")

    def close(self) -> None:
        self.control.close()
