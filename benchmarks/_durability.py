"""What ``SqlStore(url, durable_os_crash=True)`` costs an append on SQLite.

Two stores on two files of the same directory, one with the default ``synchronous=NORMAL``
(WAL: a commit survives a crash of the process), one with ``synchronous=FULL`` (an fsync of
the WAL per commit: a commit also survives an OS crash or a power loss). Each run appends
the same one-event batches (a steer's record) to both, interleaved in turns of 20 calls
with the order rotating, and takes each side's p50; the ratio is computed inside the run.
Part of the ``## Store`` section (`benchmarks.store`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._report import table
from benchmarks._stats import fmt_count, fmt_ratio, fmt_s, percentile, sample_interleaved, spread
from controlplane import ChildMeta, MessageSource, NewEvent
from persistence import SqlStore

__all__ = ["measure_durability"]

_STEER = NewEvent(
    kind="steering/message",
    turn=1,
    data={"content": [{"type": "text", "text": "Also check the second source. " * 10}]},
    source=MessageSource(kind="coordinator", sender_session_id="bench-parent"),
)


@dataclass
class _Runs:
    normal: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)


def measure_durability(*, runs: int, appends: int, workdir: Path) -> str:
    """Measure both settings and return the Markdown of the figure."""
    normal = SqlStore(f"sqlite:///{workdir / 'sync-normal.db'}")
    full = SqlStore(f"sqlite:///{workdir / 'sync-full.db'}", durable_os_crash=True)
    try:
        children = {store: _new_child(store) for store in (normal, full)}
        measured = _Runs()
        for _ in range(runs):
            samples = sample_interleaved(
                {
                    "normal": lambda: normal.append(children[normal], [_STEER]),
                    "full": lambda: full.append(children[full], [_STEER]),
                },
                appends,
            )
            normal_p50 = percentile(samples["normal"], 50)
            full_p50 = percentile(samples["full"], 50)
            measured.normal.append(normal_p50)
            measured.full.append(full_p50)
            measured.ratio.append(full_p50 / normal_p50)
            measured.rate.append(len(samples["full"]) / sum(samples["full"]))
    finally:
        normal.close()
        full.close()
    return _figure(measured, runs, appends)


def _new_child(store: SqlStore) -> str:
    child_id = str(uuid.uuid4())
    store.create_child(ChildMeta(child_id=child_id, parent_session="bench-parent", depth=1))
    return child_id


def _figure(measured: _Runs, runs: int, appends: int) -> str:
    row = [
        "append, batch of 1",
        fmt_s(spread(measured.normal)),
        fmt_s(spread(measured.full)),
        fmt_ratio(spread(measured.ratio)),
        fmt_count(spread(measured.rate)),
    ]
    header = ["operation", "NORMAL p50", "FULL p50", "FULL / NORMAL", "FULL appends/s"]
    return (
        "### SQLite durability: `durable_os_crash=True`\n\n"
        "`SqlStore(url, durable_os_crash=True)` (`PRAGMA synchronous=FULL`: each commit "
        "fsyncs the WAL, so it survives an OS crash or a power loss) against the default "
        "(`synchronous=NORMAL` in WAL mode: a commit survives a crash of the process only). "
        f"One-event appends (a steer's record), {appends} per side per run, interleaved; "
        f"median over {runs} runs of each run's p50, ratio computed inside each run. The "
        "cost is the disk's fsync latency, so it depends on the machine more than any other "
        "figure here.\n\n" + table(header, [row])
    )
