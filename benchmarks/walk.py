"""A walk of one steer and one cold resume: the project modules they visit, the threads that
run project code, and the calls that run up a layer.

A profiler (`sys.setprofile`, and `threading.setprofile` for every thread started after it)
sees every Python call in the process; it records only inside a window:

- **steer**: ``send_message`` into a running child, until it returns ``steered``;
- **cold resume**: a SQLite store holding an idle child, opened by a fresh control plane,
  then ``send_message`` to that child until ``provider.resume`` is called (the plane's
  opening is outside the window, as in `benchmarks.hops`);
- **restart, then send**: the same with the window open from ``SubagentControl.open``
  (its runtime row, sweep and actors' start) to ``provider.resume``.

In the window it keeps the module of every function called in ``controlplane``, ``actors``
or ``persistence``; each thread that ran such a function, by its name (numbers and ids cut,
so that two runs' names compare; a pooled thread is one thread, named by the loops it ran,
not also by its pool's idle name between them); and each *call up a layer*: a function of
a lower layer calling into a function of a higher layer's module (a callback, a listener, a
port the runtime implements). The caller is the nearest project frame below the callee on the
thread's stack, so a callback handed through pykka, tenacity or the standard library
counts for the project code that made the call. Layers, lowest first: the contract,
persistence, actors, the runtime, the fronts, with the providers and the telemetry beside
the runtime (they import only the contract), as `tests/test_layering.py` draws them: a
call from one layer into a layer it may not import is a call up a layer (an actor calling
the telemetry or a runtime port, persistence calling a runtime listener).

Each walk runs ``runs`` times after one warm-up (so imports and first-use caches are not in
it); a figure is the median over the runs, and the lists name what every run visited.
The script uses the public API and the benchmarks' provider only, so it runs unchanged on
an older tree: ``python -m benchmarks.walk --json out.json`` there, then
``python -m benchmarks.walk --before out.json`` here prints the two side by side.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import types
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks._harness import seed_child, sqlite_url
from benchmarks._provider import BenchProvider, BenchRun
from benchmarks._routes import Plane
from controlplane import CancelSignal, ResumeRequest, TextBlock
from persistence import SqlStore

__all__ = ["Walk", "is_up", "layer_of", "main", "walk"]

PROJECT = ("controlplane", "actors", "persistence")
_BELOW_RUNTIME = frozenset({"contract", "persistence", "actors", "telemetry", "providers"})
REACHES: dict[str, frozenset[str]] = {
    "contract": frozenset({"contract"}),
    "persistence": frozenset({"contract", "persistence"}),
    "actors": frozenset({"contract", "persistence", "actors"}),
    "telemetry": frozenset({"contract", "telemetry"}),
    "providers": frozenset({"contract", "providers"}),
    "runtime": _BELOW_RUNTIME | {"runtime"},
    "front": _BELOW_RUNTIME | {"runtime", "front"},
}
"""The layers a module of each layer may import (`tests/test_layering.py` holds the code to
it): a call from one layer into a layer it may not import is a call up a layer. Kept here,
in one file, so the walk runs unchanged on an older tree."""
COLD_LENGTH = 20
"""Messages in the cold-resumed child's transcript (the walk, not the load, is the point)."""
RESTART = "restart, then send"


def layer_of(module: str) -> str:
    """The layer of a module of ours (both the flat layout of older trees and the runtime
    package with its wings fit it)."""
    parts = module.split(".")
    if parts[0] in ("actors", "persistence"):
        return parts[0]
    sub = parts[1] if len(parts) > 1 else ""
    if sub in ("contract", "telemetry", "providers"):
        return sub
    if sub == "models":
        return "providers"
    if sub in ("cli", "tools", "aio", "fronts"):
        return "front"
    return "runtime"


def is_up(caller: str, callee: str) -> bool:
    """Whether a call from module ``caller`` into module ``callee`` runs up a layer: into
    a layer ``caller``'s may not import, so only an object handed down reaches it."""
    return layer_of(callee) not in REACHES[layer_of(caller)]


def _is_ours(module: str) -> bool:
    return module.split(".", 1)[0] in PROJECT


_RUNTIME_ID = re.compile(r":\S+")
_NUMBER = re.compile(r"0x[0-9a-f]+|\d+")


def thread_kind(name: str) -> str:
    """A thread's name with its ids and numbers cut, so that two runs' names compare:
    ``ChildSupervisor-12`` reads ``ChildSupervisor-#``, ``subagent-runtime:<runtime id>``
    reads ``subagent-runtime:#``."""
    return _NUMBER.sub("#", _RUNTIME_ID.sub(":#", name))


@dataclass
class _Window:
    """What one recording window saw."""

    modules: set[str] = field(default_factory=set)
    named: dict[int, set[str]] = field(default_factory=dict)
    """Each thread that ran project code (by its id) → the names it bore doing so."""
    up_calls: Counter[str] = field(default_factory=Counter)

    @property
    def threads(self) -> set[str]:
        """The threads that ran project code, one name each: a pooled thread renamed
        between loops (a pool's idle name, then an actor's) is one thread, named by the
        loops it ran (joined with ``+`` when it ran several)."""
        return {_thread_label(names) for names in self.named.values()}


def _thread_label(names: set[str]) -> str:
    busy = {name for name in names if "-idle" not in name} or names
    return "+".join(sorted(busy))


class _Profiler:
    """The profile hook: cheap while no window is open, recording while one is."""

    def __init__(self) -> None:
        self.window: _Window | None = None

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        window = self.window
        if window is None or event != "call":
            return
        module = frame.f_globals.get("__name__") or ""
        if not _is_ours(module):
            return
        window.modules.add(module)
        thread = threading.current_thread()
        window.named.setdefault(thread.ident or 0, set()).add(thread_kind(thread.name))
        caller = frame.f_back
        while caller is not None and not _is_ours(caller.f_globals.get("__name__") or ""):
            caller = caller.f_back
        if caller is None:
            return
        below = caller.f_globals["__name__"]
        if is_up(below, module):
            window.up_calls[
                f"{below}.{caller.f_code.co_name} → {module}.{frame.f_code.co_name}"
            ] += 1


@contextmanager
def _profiled(profiler: _Profiler) -> Iterator[None]:
    threading.setprofile(profiler)
    sys.setprofile(profiler)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


class _StopAtResume(BenchProvider):
    """The bench provider, closing the window as ``provider.resume`` is entered."""

    def __init__(self, profiler: _Profiler) -> None:
        super().__init__()
        self._profiler = profiler

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> BenchRun:
        """Close the window, then resume as the bench provider does."""
        self._profiler.window = None
        return super().resume(request, signal)


@dataclass(frozen=True)
class Walk:
    """One operation's walk over ``runs`` runs."""

    name: str
    runs: int
    modules: list[str]
    """Project modules every run visited."""
    modules_any: int
    """How many project modules any run visited."""
    threads: list[str]
    """Threads (their names, ids cut) that ran project code in every run."""
    up_calls: int
    """Calls up a layer per run (median)."""
    up_edges: list[str]
    """Caller → callee of the calls up a layer every run made."""

    def per_layer(self) -> dict[str, int]:
        """How many of ``modules`` each layer has."""
        return dict(sorted(Counter(layer_of(m) for m in self.modules).items()))

    def up_into(self) -> dict[str, int]:
        """How many of ``up_edges`` go into each layer."""
        callees = (edge.split(" → ")[1].rsplit(".", 1)[0] for edge in self.up_edges)
        return dict(sorted(Counter(layer_of(m) for m in callees).items()))


def _summary(name: str, windows: Sequence[_Window]) -> Walk:
    every = set.intersection(*(w.modules for w in windows))
    threads = set.intersection(*(w.threads for w in windows))
    edges = set.intersection(*(set(w.up_calls) for w in windows))
    return Walk(
        name=name,
        runs=len(windows),
        modules=sorted(every),
        modules_any=len(set.union(*(w.modules for w in windows))),
        threads=sorted(threads),
        up_calls=round(statistics.median(sum(w.up_calls.values()) for w in windows)),
        up_edges=sorted(edges),
    )


def _steer_walk(url: str, profiler: _Profiler, runs: int) -> Walk:
    plane = Plane.open(url)
    try:
        live: list[str] = []
        plane.grow(live, 1)  # started, published and steered once: warm
        windows = []
        for _ in range(runs):
            profiler.window = window = _Window()
            try:
                plane.steer(live[0])
            finally:
                profiler.window = None
            windows.append(window)
    finally:
        plane.close()
    return _summary("steer", windows)


def _cold_walk(
    url: str, child_id: str, profiler: _Profiler, runs: int, *, with_open: bool = False
) -> Walk:
    windows = []
    for n in range(runs + 1):  # the first run warms imports and caches up; not kept
        window = _Window()
        if with_open:
            profiler.window = window
        plane = _open(url, _StopAtResume(profiler))
        try:
            profiler.window = window
            try:
                sent = plane.control.send_message(
                    plane.parent, child_id, [TextBlock(text="continue")], None
                )
                _called, run, _request = plane.provider.wait_resumed(child_id)
            finally:
                profiler.window = None
            run.release()
            plane.control.tasks.wait(sent.task_id, timeout=60.0, requester=plane.parent)
        finally:
            plane.close()
        if n:
            windows.append(window)
    return _summary(RESTART if with_open else "cold resume", windows)


def _open(url: str, provider: BenchProvider) -> Plane:
    from benchmarks._harness import PARENT_SESSION
    from controlplane import SubagentControl

    control = SubagentControl.open(url)
    try:
        control.providers.register(provider)
        return Plane(control, provider, control.agents.register(PARENT_SESSION))
    except BaseException:
        control.close()
        raise


def walk(workdir: Path, runs: int = 3) -> list[Walk]:
    """The walks of one steer, one cold resume, and one restart then send, each over
    ``runs`` runs."""
    url = sqlite_url(workdir / "walk.db")
    with SqlStore(url) as store:
        child_id = seed_child(store, COLD_LENGTH)
    profiler = _Profiler()
    with _profiled(profiler):
        return [
            _steer_walk(url, profiler, runs),
            _cold_walk(url, child_id, profiler, runs),
            _cold_walk(url, child_id, profiler, runs, with_open=True),
        ]


def render(walks: Sequence[Walk], before: Sequence[Walk] | None = None) -> str:
    """The walks as Markdown: a table (before beside after when ``before`` is given), then
    what each visited."""

    def cells(w: Walk) -> list[str]:
        layers = ", ".join(f"{k} {v}" for k, v in w.per_layer().items())
        into = ", ".join(f"{k} {v}" for k, v in w.up_into().items())
        up = f"{w.up_calls} ({into})" if into else str(w.up_calls)
        return [str(len(w.modules)), layers, str(len(w.threads)), up]

    header = ["operation", "modules visited", "per layer", "threads", "calls up a layer (into)"]
    rows: list[list[str]] = []
    old = {w.name: w for w in before or ()}
    for w in walks:
        if w.name in old:
            rows.append([f"{w.name}, before", *cells(old[w.name])])
            rows.append([f"{w.name}, after", *cells(w)])
        else:
            rows.append([w.name, *cells(w)])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    groups = [("before", before), ("after", walks)] if before else [("", walks)]
    for label, group in groups:
        for w in group:
            title = f"{w.name}, {label}" if label else w.name
            lines += [
                "",
                f"**{title}** ({w.runs} runs; {w.modules_any} modules in any run)",
                f"- threads: {', '.join(f'`{t}`' for t in w.threads)}",
                f"- calls up a layer (every run): {'; '.join(w.up_edges) or 'none'}",
                f"- modules: {', '.join(f'`{m}`' for m in w.modules)}",
            ]
    return "\n".join(lines) + "\n"


def _load(path: Path) -> list[Walk]:
    return [Walk(**item) for item in json.loads(path.read_text(encoding="utf-8"))]


def main(argv: Sequence[str] | None = None) -> int:
    """Walk, print the Markdown, and write the walks as JSON when asked."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.walk", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs per walk (default 3)")
    parser.add_argument("--json", type=Path, help="write the walks here as JSON")
    parser.add_argument("--before", type=Path, help="a --json file to show beside this walk")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="walk-") as scratch:
        walks = walk(Path(scratch), args.runs)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(w) for w in walks], indent=1), encoding="utf-8")
    print(render(walks, _load(args.before) if args.before else None), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
