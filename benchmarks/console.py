"""The console's figures (SPEC §13), printed as a Markdown table for docs/benchmarks.md.

Usage::

    .venv/bin/python -m benchmarks.console            # SQLite in a scratch directory
    .venv/bin/python -m benchmarks.console --quick    # smoke run, numbers not citable

Three measurements, each on a store of 1,000 children and 10,000 settled Tasks:

- first byte of the overview: ``GET /`` on a fresh connection, the console's view cache
  emptied before each request (as after any change of the store), so every request reads
  the store; the whole response too;
- append → DOM: a writer in another process appends a message to a child whose page is
  open in Chromium (Playwright); the time from the append's commit (the writer's wall
  clock) to the moment the message is in the page's DOM (the browser's wall clock, same
  host; a MutationObserver stamps it);
- the child's index (`NEWEST_TASK_INDEX`): the overview's first byte reading each
  child's newest Task through it and by the scan of every Task it replaced, interleaved
  on the same console; and what it costs the write path: a Task admitted and settled on
  a store with it and on one without it, rounds interleaved;
- idle load: 10 pages open (overview, runtimes, eight children's pages) and nothing
  changing but the console's own heartbeat, for ``IDLE_S``: the marker reads and view
  reads per second the console makes of the store.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controlplane import SubagentControl
from controlplane.fronts._console import ConsoleServer
from persistence import SqlStore
from tests.console.support import populate

REPO = Path(__file__).resolve().parents[1]
WRITER = Path(__file__).with_name("_console_writer.py")
IDLE_S = 10.0


def first_byte(
    url: str, console: ConsoleServer, rounds: int, path: str = "/"
) -> tuple[list[float], list[float]]:
    """Seconds to the first byte, and to the last, of ``GET path`` (view cache emptied)."""
    firsts, wholes = [], []
    for _ in range(rounds + 3):
        first, whole = _get(url, console, path)
        firsts.append(first)
        wholes.append(whole)
    return firsts[3:], wholes[3:]  # the first three warm the process


def _get(url: str, console: ConsoleServer, path: str) -> tuple[float, float]:
    parts = urlsplit(url)
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
    console.feed.poke()  # as after a change of the store: the next page reads it
    with socket.create_connection((parts.hostname, parts.port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        conn.sendall(request.encode())
        conn.recv(1)
        first = time.perf_counter() - started
        while conn.recv(65536):
            pass
        return first, time.perf_counter() - started


def index_or_scan(
    url: str, console: ConsoleServer, store: SqlStore, rounds: int
) -> tuple[list[float], list[float]]:
    """Overview first bytes reading each child's newest Task through the child's index, and
    by the scan of every Task it replaced (`StoreOverview.newest_by_index`), interleaved."""
    indexed, scanned = [], []
    try:
        for index in range(rounds + 2):
            for by_index in (True, False) if index % 2 else (False, True):
                store.overview.newest_by_index(by_index)
                first, _whole = _get(url, console, "/")
                if index >= 2:  # the first two warm both paths
                    (indexed if by_index else scanned).append(first)
    finally:
        store.overview.newest_by_index(True)
    return indexed, scanned


def admission_cost(where: Path, rounds: int, tasks: int = 100) -> tuple[list[float], list[float]]:
    """Seconds per Task admitted and settled (`TaskLedger.admit`, then `settle`) on a store
    with the child's index and on one without it (dropped), rounds interleaved: what the
    index costs the write path."""
    import uuid
    from datetime import timedelta

    import sqlalchemy as sa

    from controlplane.contract import TaskOutcome, TaskSnapshot, TaskStatus, utcnow
    from persistence._schema import NEWEST_TASK_INDEX

    children = [str(uuid.uuid4()) for _ in range(1000)]
    with (
        SqlStore(f"sqlite:///{where}/with.db") as with_index,
        SqlStore(f"sqlite:///{where}/without.db") as without,
    ):
        engine = sa.create_engine(f"sqlite:///{where}/without.db")
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP INDEX {NEWEST_TASK_INDEX}"))
        engine.dispose()
        timed: dict[bool, list[float]] = {True: [], False: []}
        start = utcnow()
        for index in range(rounds + 1):
            for indexed in (True, False) if index % 2 else (False, True):
                store = with_index if indexed else without
                began = time.perf_counter()
                for n in range(tasks):
                    task = TaskSnapshot(
                        id=str(uuid.uuid4()),
                        label="admitted",
                        owner_session="owner",
                        status=TaskStatus.RUNNING,
                        child_id=children[n % len(children)],
                        runtime_id="bench",
                        created_at=start + timedelta(milliseconds=index * tasks + n),
                    )
                    store.ledger.admit(task)
                    done = TaskOutcome(status=TaskStatus.COMPLETED, output="done")
                    store.ledger.settle((task.id, done, task.created_at))
                if index:  # the first round warms both
                    timed[indexed].append((time.perf_counter() - began) / tasks)
    return timed[True], timed[False]


def dom_latency(url: str, store_url: str, child_id: str, rounds: int) -> list[float]:
    """Seconds from an append's commit in another process to the message in the DOM."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "install chromium (apt-get install -y chromium)"
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), store_url, child_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    latencies = []
    try:
        assert writer.stdout is not None
        assert writer.stdin is not None
        assert writer.stdout.readline().strip() == "READY"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"{url}children/{child_id}")
            page.wait_for_selector("#live.on")
            page.evaluate(
                """() => { window.__seen = {};
                new MutationObserver(() => {
                  for (const m of document.body.innerText.matchAll(/mark-(\\d+)/g))
                    if (!(m[1] in window.__seen)) window.__seen[m[1]] = Date.now();
                }).observe(document.body, {childList: true, subtree: true}); }"""
            )
            for index in range(rounds):
                writer.stdin.write(f"go {index}\n")
                writer.stdin.flush()
                committed = float(writer.stdout.readline().split()[1])
                page.wait_for_function(f"() => '{index}' in window.__seen", timeout=10_000)
                seen = page.evaluate(f"() => window.__seen['{index}']") / 1000.0
                latencies.append(seen - committed)
            browser.close()
    finally:
        with contextlib.suppress(OSError):
            writer.stdin.write("quit\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
        writer.kill()
        writer.wait(10)
    return latencies


def idle_load(url: str, console: ConsoleServer, child_ids: Sequence[str]) -> dict[str, float]:
    """Marker reads and view reads per second with 10 pages open and the store idle."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None
    paths = ["", "runtimes", *(f"children/{c}" for c in child_ids[:8])]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pages = []
        for path in paths:
            page = browser.new_page()
            page.goto(url + path)
            page.wait_for_selector("#live.on")
            pages.append(page)
        reads, views = console.feed.reads, console.feed.view_reads
        started = time.monotonic()
        time.sleep(IDLE_S)  # a measurement window, not a synchronisation
        elapsed = time.monotonic() - started
        marker = (console.feed.reads - reads) / elapsed
        view = (console.feed.view_reads - views) / elapsed
        browser.close()
    return {"pages": len(paths), "marker_reads_per_s": marker, "view_reads_per_s": view}


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="console-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _us(values: Sequence[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e6:.0f}"


def _ms(values: Sequence[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console")
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer rounds")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else 30
    with scratch() as where:
        url = f"sqlite:///{where}/console.db"
        t0 = time.monotonic()
        ids = populate(url, children=1000, tasks=10_000)
        print(f"populated in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        control = SubagentControl.open(url)
        try:
            store = control.store
            assert store is not None
            with ConsoleServer(control) as console:
                floor, _ = first_byte(console.url, console, rounds, "/static/console.css")
                firsts, wholes = first_byte(console.url, console, rounds)
                by_index, by_scan = index_or_scan(console.url, console, store, rounds)
                every_task = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    store.ledger.recent()  # what `subagent-control tasks` reads
                    every_task.append(time.perf_counter() - started)
                latencies = dom_latency(console.url, url, ids[0], rounds)
                idle = idle_load(console.url, console, ids)
        finally:
            control.close(timeout_s=10.0)
        admit_with, admit_without = admission_cost(where, rounds)
    rows: list[tuple[str, Any, Any, Any]] = [
        (
            "baseline: GET /static/console.css, first byte (ms)",
            _ms(floor, 0.5),
            _ms(floor, 0.95),
            "-",
        ),
        (
            "baseline: read every Task (`ledger.recent()`, ms)",
            _ms(every_task, 0.5),
            _ms(every_task, 0.95),
            "-",
        ),
        ("overview, first byte (ms)", _ms(firsts, 0.5), _ms(firsts, 0.95), "<= 50"),
        ("overview, whole response (ms)", _ms(wholes, 0.5), _ms(wholes, 0.95), "-"),
        (
            "overview, first byte, newest Tasks by the child's index (ms, interleaved)",
            _ms(by_index, 0.5),
            _ms(by_index, 0.95),
            "-",
        ),
        (
            "overview, first byte, newest Tasks by the scan it replaced (ms, interleaved)",
            _ms(by_scan, 0.5),
            _ms(by_scan, 0.95),
            "-",
        ),
        (
            "admit + settle one Task, with the child's index (µs, interleaved)",
            _us(admit_with, 0.5),
            _us(admit_with, 0.95),
            "-",
        ),
        (
            "admit + settle one Task, index dropped (µs, interleaved)",
            _us(admit_without, 0.5),
            _us(admit_without, 0.95),
            "-",
        ),
        (
            "append in another process → DOM (ms)",
            _ms(latencies, 0.5),
            _ms(latencies, 0.95),
            "p95 <= 1000",
        ),
    ]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs")
    print("| measure (1,000 children, 10,000 settled Tasks, SQLite) | median | p95 | goal |")
    print("| --- | --- | --- | --- |")
    for name, median, p95, goal in rows:
        print(f"| {name} | {median} | {p95} | {goal} |")
    ratio = statistics.median(by_index) / statistics.median(by_scan)
    cost = statistics.median(admit_with) / statistics.median(admit_without)
    print(
        f"\nOverview first byte by the index / by the scan: {ratio:.2f}x; admit + settle with "
        f"the index / without: {cost:.2f}x."
    )
    print(
        f"\nIdle, {idle['pages']} pages open: {idle['marker_reads_per_s']:.1f} marker reads/s "
        f"(one tiny statement each), {idle['view_reads_per_s']:.2f} view reads/s "
        f"({rounds} rounds; mean DOM latency {statistics.mean(latencies) * 1000:.0f} ms)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
