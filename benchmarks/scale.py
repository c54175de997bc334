"""Scale: threads and memory per live child; a restart over 1,000 vs 100,000 stored children.

Each figure comes from a fresh interpreter (`benchmarks._probe`), so resident memory is the
process's own and not what earlier sections left behind. The large stores are filled with
raw SQL: one child is created through the API, and its header and events are copied under
new ids (parents spread over 1,000 sessions) with ``executemany`` — seconds, not minutes.
"""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import PARENT_SESSION, seed_child, sqlite_url
from benchmarks._probe import run_probe
from benchmarks._report import Section, table
from benchmarks._stats import (
    fmt_count,
    fmt_kib,
    fmt_mib,
    fmt_ratio,
    fmt_s,
    growth_verdict,
    spread,
)
from persistence import SqlStore

__all__ = ["ScaleConfig", "run_scale"]

_BULK_BATCH = 5000


@dataclass(frozen=True)
class ScaleConfig:
    """How much to measure."""

    live: int = 1000
    live_runs: int = 3
    small: int = 1000
    large: int = 100_000
    ready_runs: int = 7

    @classmethod
    def quick(cls) -> ScaleConfig:
        """A smoke run: small, seconds."""
        return cls(live=50, live_runs=1, small=100, large=1000, ready_runs=1)


def run_scale(config: ScaleConfig, workdir: Path) -> Section:
    """Measure live-child cost and restart readiness; the report section."""
    live = [
        run_probe("live", sqlite_url(workdir / f"live-{run}.db"), str(config.live))
        for run in range(config.live_runs)
    ]
    stores = {}
    for count in (config.small, config.large):
        path = workdir / f"stored-{count}.db"
        stores[count] = (path, *bulk_children(path, count))
    ready: dict[int, list[dict[str, Any]]] = {config.small: [], config.large: []}
    for _ in range(config.ready_runs):
        for count, (path, child_id, parent) in stores.items():  # interleaved
            ready[count].append(run_probe("ready", sqlite_url(path), child_id, parent))
    sizes = {count: path.stat().st_size for count, (path, _, _) in stores.items()}
    return _section(config, live, ready, sizes)


def bulk_children(path: Path, count: int) -> tuple[str, str]:
    """Fill a SQLite store with ``count`` idle children; one to resume, and its parent."""
    store = SqlStore(sqlite_url(path))
    try:
        template = seed_child(store, 2, parent_session=PARENT_SESSION)
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        header = conn.execute(
            "SELECT * FROM subagent_children WHERE child_id = ?", (template,)
        ).fetchone()
        child_cols = _columns(conn, "subagent_children")
        id_at, parent_at = child_cols.index("child_id"), child_cols.index("parent_session")
        insert_child = _insert(conn, "subagent_children", len(child_cols))
        # The template's transcript: its sealed turns and any open rows, copied as they are.
        copies = []
        for table_name in ("subagent_segments", "subagent_events"):
            rows = conn.execute(
                f"SELECT * FROM {table_name} WHERE child_id = ?", (template,)
            ).fetchall()
            cols = _columns(conn, table_name)
            copies.append((_insert(conn, table_name, len(cols)), cols.index("child_id"), rows))
        for start in range(1, count, _BULK_BATCH):
            ids = [str(uuid.uuid4()) for _ in range(start, min(count, start + _BULK_BATCH))]
            headers = []
            for i, child_id in enumerate(ids, start=start):
                row = list(header)
                row[id_at], row[parent_at] = child_id, f"parent-{i % 1000}"
                headers.append(row)
            conn.executemany(insert_child, headers)
            for insert_row, child_at, rows in copies:
                conn.executemany(
                    insert_row,
                    (_with(row, child_at, child_id) for child_id in ids for row in rows),
                )
            conn.commit()
        # The WAL would otherwise hold every bulk page, which a real store would not.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return template, PARENT_SESSION


def _columns(conn: sqlite3.Connection, table_name: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table_name})")]


def _insert(conn: sqlite3.Connection, table_name: str, width: int) -> str:
    return f"INSERT INTO {table_name} VALUES ({', '.join('?' * width)})"


def _with(row: tuple[Any, ...], at: int, value: str) -> tuple[Any, ...]:
    return (*row[:at], value, *row[at + 1 :])


def _section(
    config: ScaleConfig,
    live: list[dict[str, Any]],
    ready: dict[int, list[dict[str, Any]]],
    sizes: dict[int, int],
) -> Section:
    n = config.live
    threads_before = spread([r["before"]["threads"] for r in live])
    threads_after = spread([r["after"]["threads"] for r in live])
    rss_before = spread([r["before"]["rss"] for r in live])
    rss_after = spread([r["after"]["rss"] for r in live])
    per_thread = spread([(r["after"]["threads"] - r["before"]["threads"]) / n for r in live])
    per_rss = spread([(r["after"]["rss"] - r["before"]["rss"]) / n for r in live])
    start = spread([r["start_s"] / n for r in live])
    live_rows = [
        ["control plane open, no child", fmt_count(threads_before), fmt_mib(rss_before)],
        [f"{n:,} live children", fmt_count(threads_after), fmt_mib(rss_after)],
        [
            "per live child",
            f"{per_thread.median:.2f}",
            fmt_kib(per_rss),
        ],
    ]
    ready_rows = []
    for count, runs in ready.items():
        ready_rows.append(
            [
                f"{count:,}",
                f"{sizes[count] / 1024 / 1024:.0f} MiB",
                fmt_s(spread([r["open_s"] for r in runs])),
                fmt_s(spread([r["ready_s"] for r in runs])),
                fmt_count(spread([r["status"]["threads"] for r in runs])),
                fmt_mib(spread([r["status"]["rss"] for r in runs])),
            ]
        )
    small, large = config.small, config.large
    growth = spread(
        [b["ready_s"] / a["ready_s"] for a, b in zip(ready[small], ready[large], strict=True)]
    )
    verdict = growth_verdict(growth, "stored children")
    body = f"""\
Every figure is measured in a fresh interpreter (median of the runs, min–max), SQLite
store. A live child is a running activation: its activation actor owns a thread (a pooled
worker running its pykka loop); its supervisor holds one only while it handles a message
(`actors._parking`). A durable-but-idle child costs nothing until a message reaches it
(one whose supervisor is still kept: see *Idle children and soak*).

**{n:,} live children** ({config.live_runs} run(s); starting and publishing took
{fmt_s(start)} per child):

{table(["", "threads", "VmRSS"], live_rows)}

**Restart with {small:,} vs {large:,} durable-but-idle children in the store**
({config.ready_runs} run(s), interleaved): `SubagentControl.open(url)`, then the first
`send_message` to one idle child until `provider.resume` is called; threads and VmRSS of
the process at that moment. Opening reads no child, and the first message loads only its
own child, so readiness must not grow with the number of stored children:

{
        table(
            [
                "children in store",
                "database",
                "open",
                "open + first send → provider.resume",
                "threads",
                "VmRSS",
            ],
            ready_rows,
        )
    }

Ready time with {large:,} stored children / with {small:,}, per run: {fmt_ratio(growth)} —
{verdict}.
"""
    figures = {  # for `--against` (benchmarks._against) and the goals (benchmarks._goals)
        "KiB per live child": per_rss.median / 1024,
        "threads per live child": per_thread.median,
    }
    return Section("Scale", body, {"growth": growth, "figures": figures})
