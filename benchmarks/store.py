"""Store benchmark: `SqlStore.append` and `SqlStore.load` beside the same SQL on the raw driver.

For each backend (SQLite file; PostgreSQL when reachable) and each run, both sides do the
same work back to back in this process, on the same database:

- append: one transaction of ``BEGIN [IMMEDIATE]``, the child's highest ``seq`` (after
  locking its header row, on PostgreSQL), ``executemany`` of the ``INSERT``, ``COMMIT`` —
  for batches of 1, 10 and 100 events. The raw side serialises each event's data with
  ``json.dumps`` and draws a batch id and a timestamp, as the store does; it skips the
  input checks (plain-JSON copy), the retry policy, the connection handling and building
  the returned models: what the ratio prices.
- load: one ``SELECT`` of the header row then the events (sealed segments merged with
  open rows, in ``seq`` order; on SQLite a segment's events read as a BLOB, as the store
  reads them), and ``json.loads`` of each row's data (of a segment: all its events at once), for
  transcripts of 100, 1,000 and 10,000 events written without a ``turn/end`` (so every
  event is its own row: the slower case). The store also builds a `LoadedSession` of
  frozen models.

On SQLite it also prices ``durable_os_crash=True`` (``synchronous=FULL``) against the
default on one-event appends (`benchmarks._durability`).

Run ``.venv/bin/python -m benchmarks.store`` (or ``python benchmarks/store.py``;
``--quick`` for a smoke run) to refresh the ``## Store`` section of docs/benchmarks.md;
``python -m benchmarks`` runs it with the other sections.
"""

from __future__ import annotations

import gc
import itertools
import json
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._durability import measure_durability
from benchmarks._history import history
from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_count, fmt_ratio, fmt_s, percentile, sample, spread
from controlplane import ChildMeta, MessageSource, NewEvent
from persistence import SqlStore

__all__ = ["StoreConfig", "run", "run_section"]

APPEND_GOAL = 1.3  # issue 25 (issue 2 had 2×)
LOAD_GOAL = 1.5

Raw = tuple[str, int, Any, dict[str, Any] | None]  # kind, turn, data, source


@dataclass(frozen=True)
class StoreConfig:
    """How much to measure. Counts are per side and per run."""

    runs: int = 7
    appends: dict[int, int] = field(default_factory=lambda: {1: 400, 10: 150, 100: 30})
    loads: dict[int, int] = field(default_factory=lambda: {100: 150, 1_000: 30, 10_000: 6})
    durable_appends: int = 300

    @classmethod
    def quick(cls) -> StoreConfig:
        """A smoke run: seconds, not citable."""
        return cls(
            runs=2,
            appends={1: 40, 10: 15, 100: 4},
            loads={100: 10, 1_000: 4, 10_000: 1},
            durable_appends=40,
        )


def run(*, quick: bool, workdir: Path, pg_url: str | None) -> str:
    """Measure every backend and return the Markdown body of the ``## Store`` section."""
    return run_section(quick=quick, workdir=workdir, pg_url=pg_url).body


def run_section(*, quick: bool, workdir: Path, pg_url: str | None) -> Section:
    """Measure every backend; the ``## Store`` section, its headline figures in its data
    (for `--against`, `benchmarks._against`)."""
    config = StoreConfig.quick() if quick else StoreConfig()
    parts = [_method(config)]
    sqlite_path = workdir / "store-bench.db"
    sqlite_rows = _measure_sqlite(config, sqlite_path)
    parts.append(_backend_table("SQLite (file, WAL)", sqlite_rows))
    parts.append(
        measure_durability(runs=config.runs, appends=config.durable_appends, workdir=workdir)
    )
    figures = _figures("SQLite", sqlite_rows)
    if pg_url is None:
        parts.append("PostgreSQL: skipped (no reachable server).")
    else:
        from benchmarks._harness import pg_schema

        with pg_schema(pg_url) as url:
            pg_rows = _measure_postgres(config, url)
        parts.append(_backend_table("PostgreSQL", pg_rows))
        figures |= _figures("PostgreSQL", pg_rows)
    return Section("Store", "\n\n".join(parts), {"figures": figures})


def _figures(backend: str, rows: list[_Row]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for row in rows:
        figures[f"{row.label} p50 ({backend})"] = spread(row.ours).median
        figures[f"{row.label}, SqlStore / raw ({backend})"] = spread(row.ratio).median
    return figures


# -- the raw baselines -------------------------------------------------------------------


def store_statements(placeholder: str) -> Any:
    """The child statements the store under test runs (``placeholder``: ``?`` for SQLite,
    ``%s`` for PostgreSQL), for the raw baseline to run on its bare connection: the same
    text, so the ratio measures the store's own overhead, not a difference in SQL."""
    sqlite = placeholder == "?"
    try:
        from persistence._children_sql import ChildStatements
        from persistence._dialect import PostgresSql, SqliteSql
    except ImportError:  # a tree from before the statements were compiled (--against)
        from persistence._backend import Statements  # type: ignore[attr-defined]

        return Statements.build(placeholder, row_locks=not sqlite, blob_segments=sqlite)
    return ChildStatements.build(SqliteSql() if sqlite else PostgresSql(), blob_segments=sqlite)


class _RawDriver:
    """The store's own statements on one bare DBAPI connection (sqlite3 or psycopg)."""

    def __init__(self, conn: Any, placeholder: str, begin: str, *, text_times: bool) -> None:
        self._conn = conn
        self._begin = begin
        self._text_times = text_times
        statements = store_statements(placeholder)
        self._load, self._last_seq, self._insert = (
            statements.load,
            statements.last_seq,
            statements.insert,
        )
        # PostgreSQL serializes a child's appends on its header row; SQLite on BEGIN IMMEDIATE.
        self._lock_child: str | None = statements.lock_child

    def append(self, child_id: str, events: Sequence[Raw]) -> None:
        now = datetime.now(UTC)
        stamp = now.isoformat(timespec="microseconds") if self._text_times else now
        batch = uuid.uuid4().hex
        cursor = self._conn.cursor()
        cursor.execute(self._begin)
        if self._lock_child is not None:
            cursor.execute(self._lock_child, (child_id,))
            cursor.fetchone()
        cursor.execute(self._last_seq, (child_id,))
        last, _claim_runtime, _fence = cursor.fetchone()
        first = last + 1
        cursor.executemany(
            self._insert,
            [
                (
                    child_id,
                    first + i,
                    turn,
                    kind,
                    json.dumps(data),
                    None if source is None else json.dumps(source),
                    batch,
                    stamp,
                )
                for i, (kind, turn, data, source) in enumerate(events)
            ],
        )
        cursor.execute("COMMIT")

    def load(self, child_id: str) -> tuple[Any, list[tuple[Any, ...]]]:
        cursor = self._conn.cursor()
        cursor.execute(self._load, (child_id, child_id, child_id))
        header = cursor.fetchone()
        loads = json.loads
        rows: list[Any] = []
        for seq, turn, kind, data, source, created in cursor.fetchall():
            if turn is None:  # a sealed turn: its events in one JSON array
                rows += loads(data)
            else:
                rows.append((seq, turn, kind, loads(data), source, created))
        return header, rows

    def close(self) -> None:
        self._conn.close()


def _raw_sqlite(path: Path) -> _RawDriver:
    conn = sqlite3.connect(path, isolation_level=None, timeout=5.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return _RawDriver(conn, "?", "BEGIN IMMEDIATE", text_times=True)


def _raw_postgres(url: str) -> _RawDriver:
    import psycopg
    import sqlalchemy

    libpq = sqlalchemy.make_url(url).set(drivername="postgresql")
    conn = psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True)
    conn.execute("SET TIME ZONE 'UTC'")
    return _RawDriver(conn, "%s", "BEGIN", text_times=False)


# -- measuring ---------------------------------------------------------------------------


@dataclass
class _Row:
    """One operation's per-run figures: p50 latencies, the ratio, events per second."""

    label: str
    events: int
    ours: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    goal: float = 0.0

    def add(self, ours: list[float], raw: list[float]) -> None:
        ours_p50, raw_p50 = percentile(ours, 50), percentile(raw, 50)
        self.ours.append(ours_p50)
        self.raw.append(raw_p50)
        self.ratio.append(ours_p50 / raw_p50)
        self.rate.append(self.events * len(ours) / sum(ours))


def _measure_sqlite(config: StoreConfig, path: Path) -> list[_Row]:
    store = SqlStore(f"sqlite:///{path}")
    raw = _raw_sqlite(path)
    try:
        return _measure(config, store, raw)
    finally:
        store.close()
        raw.close()


def _measure_postgres(config: StoreConfig, url: str) -> list[_Row]:
    store = SqlStore(url)
    raw = _raw_postgres(url)
    try:
        return _measure(config, store, raw)
    finally:
        store.close()
        raw.close()


def _measure(config: StoreConfig, store: SqlStore, raw: _RawDriver) -> list[_Row]:
    appends = {n: _Row(f"append, batch of {n}", n, goal=APPEND_GOAL) for n in config.appends}
    loads = {n: _Row(f"load, {n:,} events", n, goal=LOAD_GOAL) for n in config.loads}
    ours_child, raw_child = _new_child(store), _new_child(store)
    transcripts = {n: _transcript_child(store, n) for n in config.loads}
    events = _events()
    for run_index in range(config.runs):
        # Alternate which side goes first, so a drift within the run favours neither.
        ours_first = run_index % 2 == 0
        for size, count in config.appends.items():
            # Both sides get the same mix of consecutive messages (sizes vary a lot).
            batches = [list(itertools.islice(events, size)) for _ in range(count)]
            ours_batches = [[event for event, _ in batch] for batch in batches]
            raw_batches = [[raw_event for _, raw_event in batch] for batch in batches]
            appends[size].add(
                *_both(
                    ours_first,
                    _timer(lambda batch: store.append(ours_child, batch), ours_batches),
                    _timer(lambda batch: raw.append(raw_child, batch), raw_batches),
                )
            )
        for size, count in config.loads.items():
            child = [transcripts[size]] * count
            loads[size].add(*_both(ours_first, _timer(store.load, child), _timer(raw.load, child)))
    return [*appends.values(), *loads.values()]


def _timer(op: Callable[[Any], object], args: list[Any]) -> Callable[[], list[float]]:
    """A function timing ``op(arg)`` for each of ``args``."""

    def timed() -> list[float]:
        feed = iter(args)
        return sample(lambda: op(next(feed)), len(args))

    return timed


def _both(
    ours_first: bool, ours: Callable[[], list[float]], raw: Callable[[], list[float]]
) -> tuple[list[float], list[float]]:
    gc.collect()
    if ours_first:
        first = ours()
        return first, raw()
    second = raw()
    return ours(), second


def _new_child(store: SqlStore) -> str:
    child_id = str(uuid.uuid4())
    store.create_child(ChildMeta(child_id=child_id, parent_session="bench-parent", depth=1))
    return child_id


def _transcript_child(store: SqlStore, size: int) -> str:
    child_id = _new_child(store)
    events = [event for event, _ in itertools.islice(_events(), size)]
    for start in range(0, size, 500):
        store.append(child_id, events[start : start + 500])
    return child_id


def _events() -> Iterator[tuple[NewEvent, Raw]]:
    """The messages of `history` (user 100–600 characters, assistant 200–2,000), each as
    the store's `NewEvent` and as the raw side's tuple, cycling forever."""
    user = MessageSource(kind="user")
    pairs = []
    turn = 0
    for message in history(1_000):
        if message.role == "user":
            turn += 1
        source = user if message.role == "user" else None
        kind = f"{message.role}/message"
        data = {"text": message.text}
        pairs.append(
            (
                NewEvent(kind=kind, turn=turn, data=data, source=source),
                (kind, turn, data, None if source is None else source.model_dump()),
            )
        )
    return itertools.cycle(pairs)


# -- the report --------------------------------------------------------------------------


def _backend_table(title: str, rows: list[_Row]) -> str:
    body = [
        [
            row.label,
            fmt_s(spread(row.ours)),
            fmt_s(spread(row.raw)),
            fmt_ratio(spread(row.ratio)) + _verdict(spread(row.ratio), row.goal),
            fmt_count(spread(row.rate)),
        ]
        for row in rows
    ]
    header = ["operation", "SqlStore p50", "raw SQL p50", "SqlStore / raw", "SqlStore events/s"]
    return f"### {title}\n\n" + table(header, body)


def _verdict(ratio: Spread, goal: float) -> str:
    return f" (goal ≤ {goal:g}×: {'met' if ratio.median <= goal else 'missed'})"


def _method(config: StoreConfig) -> str:
    appends = ", ".join(f"{count} × batch of {n}" for n, count in config.appends.items())
    loads = ", ".join(f"{count} × {n:,} events" for n, count in config.loads.items())
    return (
        "`SqlStore.append` and `SqlStore.load` beside the same statements on the raw driver "
        "(`sqlite3` / psycopg 3, one open connection, same pragmas), in the same process and "
        "database. Append: one transaction (`BEGIN [IMMEDIATE]`, the child's highest `seq` "
        "— its header row locked first on PostgreSQL — `executemany` of the `INSERT` over n "
        "rows, `COMMIT`); the "
        "raw side also "
        "`json.dumps` each event and draws a batch id and a timestamp. Load: one `SELECT` of "
        "the header row and the events, plus `json.loads` of each row's data; the store "
        "decodes with orjson (and encodes with it on append) and also builds a `LoadedSession` of "
        "frozen models. Both sides append the same "
        "consecutive messages of the benchmark conversation "
        "(`benchmarks/_history.py`: user messages 100–600 characters, assistant messages "
        "200–2,000). Each run measures both sides back to back "
        f"(per side per run: {appends}; {loads}); the table shows the median over "
        f"{config.runs} runs of each run's p50, with the runs' min–max, and the ratio "
        "computed inside each run; events/s is events over the store side's total time. "
        "Goals (SPEC §8, issues 2 and 25): load ≤ 1.5× raw, append ≤ 1.3× raw. Refresh: "
        "`.venv/bin/python -m benchmarks.store`."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Refresh the ``## Store`` section of docs/benchmarks.md (other sections are kept)."""
    from benchmarks.__main__ import main as run_sections

    args = list(sys.argv[1:] if argv is None else argv)
    return run_sections(["--sections", "store", *args])


if __name__ == "__main__":
    sys.exit(main())
