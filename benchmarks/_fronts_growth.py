"""Protocol fronts (issue 28), the ownership check: what a steer through `ToolHandlers` costs
as the parent's session grows, against the Python API's steer in the same session.

`send_message` refuses a child that is not the caller's. The check used to list the
session's children and Tasks, a cost that grew with the session; it now reads the child's
stored header (one indexed point read) the first time a `ToolHandlers` sees the child, and
remembers it (a child's parent never changes). Three paths, taking turns chunk by chunk:

- ``api``: ``control.send_message``;
- ``tools``: ``ToolHandlers.call("send_message")`` to a child it has steered before;
- ``tools, first steer``: the same on a fresh ``ToolHandlers`` per call, so every call
  reads the child's header.

Synchronous calls (no thread hop: the check and the tool's own work alone), SQLite. The
session grows by settled children (a stored header and a settled Task each) beside the
live children steered.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks._harness import frozen_gc, sqlite_url
from benchmarks._provider import BenchProvider
from benchmarks._report import table
from benchmarks._stats import (
    fmt_ratio,
    fmt_s,
    growth_verdict,
    percentile,
    sample_interleaved,
    spread,
)
from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    MessageSource,
    SubagentControl,
    TextBlock,
)

__all__ = ["GrowthConfig", "measure_growth"]

_PARENT = "bench-growth"
_MESSAGE = "Also check the migration for the events table; keep seq gapless."
_MODES = ("api", "tools", "tools, first steer")
_BATCH = 50  # settled children are started this many at a time (each live one holds threads)
_WAIT_S = 60.0


@dataclass(frozen=True)
class GrowthConfig:
    """How much to measure."""

    sizes: tuple[int, ...] = (0, 250, 1000)
    live: int = 20
    rounds: int = 5
    ops: int = 200
    chunk: int = 20

    @classmethod
    def quick(cls) -> GrowthConfig:
        """A smoke run: seconds."""
        return cls(sizes=(0, 20), live=4, rounds=2, ops=20, chunk=10)


Rounds = dict[int, dict[str, list[float]]]
"""Settled children → path → p50 per round."""


def measure_growth(config: GrowthConfig, workdir: Path) -> str:
    """Measure the paths at each session size; the report's subsection (Markdown)."""
    from controlplane.tools import ToolHandlers

    provider = BenchProvider()
    control = SubagentControl.open(sqlite_url(workdir / "fronts-growth.db"))
    try:
        control.providers.register(provider)
        parent = control.agents.register(_PARENT)
        source = MessageSource(kind="coordinator", sender_session_id=_PARENT)
        pool = [_start(control, parent, provider.name) for _ in range(config.live)]
        for child_id in pool:  # returns once published: steerable from here on
            control.send_message(parent, child_id, [TextBlock(text="warm")], source)
        rng = random.Random(28)
        remembered = ToolHandlers(control, parent, provider=provider.name)
        message = [TextBlock(text=_MESSAGE)]

        def tool_steer(tools: ToolHandlers) -> None:
            arguments = {"subagent_id": rng.choice(pool), "message": _MESSAGE}
            text = tools.call("send_message", arguments).text
            if not text.startswith("message delivered"):
                raise AssertionError(f"expected a steer, got {text!r}")

        paths: dict[str, Callable[[], object]] = {
            "api": lambda: control.send_message(parent, rng.choice(pool), message, source),
            "tools": lambda: tool_steer(remembered),
            "tools, first steer": lambda: tool_steer(
                ToolHandlers(control, parent, provider=provider.name)
            ),
        }
        rounds: Rounds = {}
        settled = 0
        for size in config.sizes:
            settled += _grow(control, parent, provider, size - settled)
            p50 = rounds.setdefault(size, {mode: [] for mode in _MODES})
            with frozen_gc():
                for _ in range(config.rounds):
                    timed = sample_interleaved(paths, config.ops, chunk=config.chunk)
                    for mode, samples in timed.items():
                        p50[mode].append(percentile(samples, 50))
        tasks = len(control.tasks.list(parent))
    finally:
        provider.release_all()
        control.close()
    return _body(config, rounds, tasks)


def _start(control: SubagentControl, parent: AgentHandle, provider: str) -> str:
    spec = ContinuableStartSpec(
        provider=provider, label="growth", prompt=[TextBlock(text="go")], parent=parent
    )
    return control.start_continuable(spec).child_id


def _grow(
    control: SubagentControl, parent: AgentHandle, provider: BenchProvider, count: int
) -> int:
    """Add ``count`` settled, stored children to the parent's session; how many it added."""
    warm = [TextBlock(text="warm")]
    done = 0
    while done < count:
        batch = [_start(control, parent, provider.name) for _ in range(min(_BATCH, count - done))]
        for child_id in batch:
            # Answered once the run is published, so the child is stored; then its turn ends.
            task_id = control.send_message(parent, child_id, warm).task_id
            provider.runs[child_id].release()
            control.tasks.wait(task_id, _WAIT_S, requester=parent)
        done += len(batch)
    return done


def _body(config: GrowthConfig, rounds: Rounds, tasks: int) -> str:
    sizes = list(rounds)
    rows = []
    for size in sizes:
        p50 = rounds[size]
        api = p50["api"]

        def ratio(mode: str, p50: dict[str, list[float]] = p50, api: list[float] = api) -> str:
            return fmt_ratio(spread([m / a for m, a in zip(p50[mode], api, strict=True)]))

        rows.append(
            [
                f"{config.live} live + {size} settled",
                fmt_s(spread(api)),
                fmt_s(spread(p50["tools"])),
                ratio("tools"),
                fmt_s(spread(p50["tools, first steer"])),
                ratio("tools, first steer"),
            ]
        )
    first, last = sizes[0], sizes[-1]
    verdicts = []
    for mode in _MODES[1:]:
        growth = spread(
            [
                (big / big_api) / (small / small_api)
                for big, big_api, small, small_api in zip(
                    rounds[last][mode],
                    rounds[last]["api"],
                    rounds[first][mode],
                    rounds[first]["api"],
                    strict=True,
                )
            ]
        )
        verdicts.append(
            f"- `{mode}` / `api`, {last} settled children against {first}: "
            f"{fmt_ratio(growth)}: {growth_verdict(growth, 'children')}"
        )
    header = [
        "parent's session (children)",
        "api p50",
        "tools p50",
        "tools / api",
        "tools, first steer p50",
        "first steer / api",
    ]
    return "\n\n".join(
        [
            "### The ownership check as the session grows",
            (__doc__ or "").split("\n\n", 1)[1].strip(),
            f"{config.ops} calls per path per round in chunks of {config.chunk}, "
            f"{config.rounds} rounds per size (the parent held {tasks} Tasks at the end). "
            "p50: median (min–max) across rounds; ratios taken inside each round.",
            table(header, rows),
            "\n".join(verdicts),
        ]
    )
