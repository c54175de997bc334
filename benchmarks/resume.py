"""Cold resume against transcript length, beside LangGraph and the OpenAI Agents SDK.

A child whose transcript holds 100 / 1,000 / 10,000 messages is created through the store,
written as a real child's is (a turn's frame at once, then each message, then the turn's
end; a version-1 descriptor in turn 1). Each run then opens a fresh control
plane on the store — nothing cached — and times ``send_message`` until ``provider.resume``
is called with the rebuilt child (store load, authorization, descriptor fold, the request
with every earlier event). The rivals restore the same messages from their SQLite files
through fresh connections (see `benchmarks._rivals`). Within a run every system is timed
back to back, in an order that rotates between runs, each after a collection of what the
previous one left (a closed control plane's reference cycles would otherwise be collected
inside the next system's span).
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from benchmarks._harness import (
    frozen_gc,
    pg_schema,
    seed_child,
    sqlite_url,
    transcript_events,
)
from benchmarks._history import history
from benchmarks._report import Section, table
from benchmarks._rivals import LangGraphRival, OpenAISessionRival, Rival
from benchmarks._routes import Plane
from benchmarks._stats import Spread, fmt_ratio, fmt_s, spread
from controlplane import TextBlock
from persistence import SqlStore

__all__ = ["ResumeConfig", "run_resume"]

OURS_SQLITE = "ours, SQLite"
OURS_PG = "ours, PostgreSQL"
LOAD_ONLY = "store.load only (SQLite)"
LANGGRAPH = "LangGraph SqliteSaver"
OPENAI = "OpenAI Agents SQLiteSession"


@dataclass(frozen=True)
class ResumeConfig:
    """How much to measure."""

    lengths: tuple[int, ...] = (100, 1000, 10000)
    runs: int = 9

    @classmethod
    def quick(cls) -> ResumeConfig:
        """A smoke run: small, seconds."""
        return cls(lengths=(100, 1000), runs=2)


def run_resume(config: ResumeConfig, workdir: Path, pg_url: str | None, pg_note: str) -> Section:
    """Measure cold resumes; the report section (its data holds the plot's series)."""
    timings: dict[str, dict[int, list[float]]] = {}
    notes = [] if pg_url is not None else [f"PostgreSQL was skipped: {pg_note}."]
    with contextlib.ExitStack() as stack:
        systems, rows = _prepare(config, workdir, pg_url, stack, notes)
        stack.enter_context(frozen_gc())
        for run in range(config.runs):
            for length in config.lengths:
                order = list(systems.items())
                shift = run % len(order)
                for name, measure in order[shift:] + order[:shift]:
                    # What the system measured before left behind (a closed control plane's
                    # cycles, a rival's objects) is collected here, not in the next span.
                    gc.collect()
                    timings.setdefault(name, {}).setdefault(length, []).append(measure(length))
    series = {name: {n: spread(v) for n, v in per.items()} for name, per in timings.items()}
    return _section(config, series, timings, notes, rows)


Measure = Callable[[int], float]


def _prepare(
    config: ResumeConfig,
    workdir: Path,
    pg_url: str | None,
    stack: contextlib.ExitStack,
    notes: list[str],
) -> tuple[dict[str, Measure], int]:
    """Each system's measure, and how many rows hold our longest transcript."""
    systems: dict[str, Measure] = {}
    sqlite = sqlite_url(workdir / "resume.db")
    sqlite_children = _seed_store(sqlite, config.lengths)
    rows = _stored_rows(workdir / "resume.db", sqlite_children[max(config.lengths)])
    systems[OURS_SQLITE] = _ours(sqlite, sqlite_children)
    if pg_url is not None:
        url = stack.enter_context(pg_schema(pg_url))
        systems[OURS_PG] = _ours(url, _seed_store(url, config.lengths))
    for rival in (LangGraphRival(workdir), OpenAISessionRival(workdir)):
        why = rival.unavailable()
        if why is not None:
            notes.append(f"{rival.name} was skipped: {why}.")
            continue
        stack.callback(rival.close)
        for n in config.lengths:
            rival.seed(f"history-{n}", history(n))
        systems[rival.name] = partial(_restore, rival)
    systems[LOAD_ONLY] = _load_only(sqlite, sqlite_children)
    return systems, rows


def _per_event(series: dict[str, dict[int, Spread]], n: int, rows: int) -> str:
    """Each system's time at ``n`` messages over the events it reads back."""
    if OPENAI not in series:
        return ""
    events = len(transcript_events(history(n)))
    ours = series[OURS_SQLITE][n].median / events
    theirs = series[OPENAI][n].median / n
    return (
        f"\nPer event read back, at {n:,} messages: ours {ours * 1e6:.2f} µs over "
        f"{events:,} events (stored in {rows:,} rows: one per finished turn), the Agents "
        f"SDK's session {theirs * 1e6:.2f} µs over {n:,} items (one row each).\n"
    )


def _stored_rows(path: Path, child_id: str) -> int:
    """The rows that hold a child's transcript in a SQLite store: segments and open rows."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM subagent_segments WHERE child_id = ?) "
            "+ (SELECT count(*) FROM subagent_events WHERE child_id = ?)",
            (child_id, child_id),
        ).fetchone()
    return int(row[0])


def _restore(rival: Rival, n: int) -> float:
    return rival.restore(f"history-{n}", n)


def _seed_store(url: str, lengths: tuple[int, ...]) -> dict[int, str]:
    store = SqlStore(url)
    try:
        return {n: seed_child(store, n) for n in lengths}
    finally:
        store.close()


def _ours(url: str, children: dict[int, str]) -> Measure:
    def measure(n: int) -> float:
        plane = Plane.open(url)
        try:
            resumed = plane.resume(children[n], [TextBlock(text="continue")], source=None)
        finally:
            plane.close()
        if len([e for e in resumed.request.events if e.kind.endswith("/message")]) < n:
            raise AssertionError(f"the resumed child got fewer than {n} messages")
        return resumed.to_provider_s

    return measure


def _load_only(url: str, children: dict[int, str]) -> Measure:
    def measure(n: int) -> float:
        store = SqlStore(url)
        try:
            t0 = time.perf_counter()
            store.load(children[n])
            return time.perf_counter() - t0
        finally:
            store.close()

    return measure


def _section(
    config: ResumeConfig,
    series: dict[str, dict[int, Spread]],
    raw: dict[str, dict[int, list[float]]],
    notes: list[str],
    stored_rows: int,
) -> Section:
    rivals = [name for name in (LANGGRAPH, OPENAI) if name in series]
    columns = [name for name in (OURS_SQLITE, OURS_PG) if name in series] + rivals
    rows = []
    ratios: dict[int, Spread] = {}
    for n in config.lengths:
        row = [f"{n:,}", *(fmt_s(series[c][n]) for c in columns)]
        if rivals:
            # Per run: ours against the faster rival of that same run.
            per_run = zip(raw[OURS_SQLITE][n], *(raw[r][n] for r in rivals), strict=True)
            ratios[n] = spread([ours / min(theirs) for ours, *theirs in per_run])
            row.append(fmt_ratio(ratios[n]))
        rows.append([*row, fmt_s(series[LOAD_ONLY][n])])
    header = ["messages", *columns]
    if rivals:
        header.append("ours SQLite / faster rival")
    header.append("store.load alone (SQLite)")
    longest = max(config.lengths)
    beats_all = bool(rivals) and all(r.median <= 1.0 for r in ratios.values())
    beats_at_longest = bool(rivals) and series[OURS_SQLITE][longest].median < min(
        series[r][longest].median for r in rivals
    )
    goal = (
        f"ours faster than both at {longest:,} messages: "
        f"{'yes' if beats_at_longest else '**no**'}; at least as fast as the faster rival at "
        f"every length: {'yes' if beats_all else '**no**'}"
    )
    note_lines = "".join(f"\n{note}\n" for note in notes)
    per_event = _per_event(series, longest, stored_rows)
    body = f"""\
Time from `send_message` on a freshly opened control plane to `provider.resume` being
called with the rebuilt child, against restoring the same messages with LangGraph's
`SqliteSaver.get_tuple` (the thread's latest checkpoint, `messages` channel) and the OpenAI
Agents SDK's `SQLiteSession.get_items()`. Median of {config.runs} runs (min–max); every run
opens new connections; the OS page cache is warm for all systems alike; the benchmark's
own objects are frozen out of the garbage collector (`gc.freeze()`) and the garbage of the
previous measure is collected before each one, so a collection costs each system only what it
allocates. Our supervisor and activation actors run on reused worker threads
(`actors._pool`), as in any process that ran an activation before. Messages average
~950 characters (users 100–600, assistants 200–2,000); one user message then four
assistant messages per turn. Our transcript also holds `turn/start`/`turn/end` per turn
and the descriptor, so it has ~1.4 events per message, written as a live child writes them
(one write per turn frame, per message and per turn end, each with its own timestamp; the
write of each `turn/end` seals the turn into one row); LangGraph's store holds only the
newest checkpoint (a real thread has one per step, which `get_tuple` does not read).
The last column is `SqlStore.load` alone on a fresh store, the largest part of our time.
{note_lines}
SPEC §8 goal — {goal}.

{table(header, rows)}
{per_event}
![Cold resume latency against transcript length](resume_latency.png)
"""
    figures = {
        f"cold resume p50, {n:,} messages (SQLite)": series[OURS_SQLITE][n].median
        for n in config.lengths
    }
    figures |= {f"cold resume / faster rival, {n:,} messages": r.median for n, r in ratios.items()}
    figures |= {
        f"store.load p50, {n:,} messages (SQLite)": series[LOAD_ONLY][n].median
        for n in config.lengths
    }
    data: dict[str, object] = {
        "series": series,
        "goal": beats_all and beats_at_longest,
        "figures": figures,  # for `--against` (benchmarks._against)
    }
    return Section("Cold resume", body, data)
