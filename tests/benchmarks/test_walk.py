"""The walk (`benchmarks.walk`): at its smallest size it names sane modules, threads and calls
up a layer, and its profiler tells a call up a layer from one down. Nothing is timed."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks.walk import Walk, _Profiler, _Window, is_up, layer_of, render, thread_kind
from tests.support import run_python


def _module(name: str, source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(source, namespace)  # a function whose frames carry ``name`` as their module
    return namespace


def _profiled_call(call: Any, *args: Any) -> _Window:
    profiler = _Profiler()
    profiler.window = window = _Window()
    sys.setprofile(profiler)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    return window


def test_a_callback_from_a_lower_layer_counts_as_a_call_up_even_through_foreign_code() -> None:
    high = _module("controlplane.runtime._walk_probe", "def callback():\n    return 1\n")
    foreign = _module("walk_probe_library", "def via(f):\n    return f()\n")
    low = _module("persistence._walk_probe", "def notify(via, f):\n    return via(f)\n")

    window = _profiled_call(low["notify"], foreign["via"], high["callback"])

    assert window.up_calls == {
        "persistence._walk_probe.notify → controlplane.runtime._walk_probe.callback": 1
    }
    assert window.modules == {"persistence._walk_probe", "controlplane.runtime._walk_probe"}
    assert window.threads == {"MainThread"}


def test_a_call_down_a_layer_or_within_one_is_not_a_call_up() -> None:
    low = _module("persistence._walk_probe", "def read():\n    return 1\n")
    peer = _module("controlplane.runtime._walk_peer", "def helper():\n    return 2\n")
    high = _module(
        "controlplane.runtime._walk_probe",
        "def send(read, helper):\n    return read() + helper()\n",
    )

    window = _profiled_call(high["send"], low["read"], peer["helper"])

    assert not window.up_calls
    assert len(window.modules) == 3


def test_the_layer_map_reads_both_the_flat_and_the_winged_runtime() -> None:
    assert layer_of("controlplane._task_book") == layer_of("controlplane.runtime.tasks._task_book")
    assert layer_of("controlplane.fronts._tools") == layer_of("controlplane.tools") == "front"
    assert is_up("persistence._claims", "actors.supervisor")
    assert is_up("actors.supervisor", "controlplane.runtime._facade")
    assert is_up("actors.activation", "controlplane.telemetry._run_spans")
    assert not is_up("controlplane.runtime._facade", "actors.supervisor")
    assert not is_up("actors.supervisor", "controlplane.contract._usage")
    assert thread_kind("ChildSupervisor-12") == thread_kind("ChildSupervisor-3")
    assert thread_kind("subagent-runtime:vm-1-2fa3") == "subagent-runtime:#"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_one_run_walk_of_a_steer_and_a_cold_resume_names_sane_modules_and_threads(
    tmp_path: Path,
) -> None:
    out = tmp_path / "walk.json"

    done = run_python("-m", "benchmarks.walk", "--runs", "1", "--json", str(out), timeout=110)

    assert done.returncode == 0, done.stderr[-4000:]
    walks = {w["name"]: Walk(**w) for w in json.loads(out.read_text(encoding="utf-8"))}
    assert set(walks) == {"steer", "cold resume", "restart, then send"}
    steer, cold, restart = walks["steer"], walks["cold resume"], walks["restart, then send"]
    assert "actors.supervisor" in steer.modules
    assert "persistence._store" in steer.modules
    assert "actors.activation" in cold.modules
    assert "actors.activation" not in steer.modules
    assert "persistence._migrations" in restart.modules  # the open is in its window
    assert "persistence._migrations" not in cold.modules
    assert "MainThread" in steer.threads  # into a running turn: no hop, the caller's thread
    assert "MainThread" in restart.threads
    assert len(restart.threads) >= len(steer.threads)
    for w in walks.values():
        assert all(m.split(".")[0] in ("controlplane", "actors", "persistence") for m in w.modules)
        assert w.up_calls >= len(w.up_edges)
        for edge in w.up_edges:
            caller, callee = (side.rsplit(".", 1)[0] for side in edge.split(" → "))
            assert is_up(caller, callee), edge
    assert "| steer | " in done.stdout
    assert "| cold resume | " in done.stdout

    beside = render(list(walks.values()), list(walks.values()))
    assert "| steer, before | " in beside
    assert "| steer, after | " in beside


def test_a_pooled_thread_renamed_between_loops_counts_once_by_its_loops_name() -> None:
    probe = _module("actors._walk_probe", "def step():\n    return 1\n")
    thread = threading.current_thread()
    name = thread.name

    def renamed_between_calls() -> None:
        try:
            for current in ("actor-pool-idle", "ChildSupervisor-7", "actor-pool-idle"):
                thread.name = current
                probe["step"]()
        finally:
            thread.name = name

    window = _profiled_call(renamed_between_calls)

    assert window.threads == {"ChildSupervisor-#"}
