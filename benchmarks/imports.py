"""What a fresh process pays before it does anything: the public import and two commands.

Each case runs in a fresh interpreter, ``runs`` times, interleaved with the others (so a
burst of outside load hits them alike): ``python -c pass`` (the interpreter alone),
``import sqlalchemy`` and ``import pydantic`` (what the store and the contract build on),
``from controlplane import SubagentControl``, and the ``subagent-control`` command's
``--help`` and ``tasks`` on a SQLite store, as an installed console script runs them.
Wall time is from the process's start to its exit; CPU time is the process's user +
system time (``os.wait4``), which other users' load inflates less than wall time. The
figure is the median of the runs, with their min–max. Which modules load is tested
(``tests/test_import_cost.py``); the time is only measured here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._report import Section, table
from benchmarks._stats import Spread, spread

__all__ = ["ImportsConfig", "run_imports"]

TITLE = "Start-up and imports"
IMPORT_GOAL_S = 0.250
COMMAND_GOAL_S = 0.300
_THIS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ImportsConfig:
    """How many fresh processes per case."""

    runs: int = 9

    @classmethod
    def quick(cls) -> ImportsConfig:
        """A smoke run."""
        return cls(runs=2)


def _cases(store_url: str) -> dict[str, list[str]]:
    py = sys.executable
    cli = "from controlplane.cli import main; raise SystemExit(main())"
    return {
        "python -c pass": [py, "-c", "pass"],
        "import pydantic": [py, "-c", "import pydantic"],
        "import sqlalchemy": [py, "-c", "import sqlalchemy"],
        "from controlplane import SubagentControl": [
            py, "-c", "from controlplane import SubagentControl",
        ],
        "subagent-control --help": [py, "-c", cli, "--help"],
        "subagent-control tasks (SQLite)": [py, "-c", cli, "tasks", "--db", store_url],
    }  # fmt: skip


_GOALS = {
    "from controlplane import SubagentControl": IMPORT_GOAL_S,
    "subagent-control --help": COMMAND_GOAL_S,
    "subagent-control tasks (SQLite)": COMMAND_GOAL_S,
}


def run_imports(config: ImportsConfig, workdir: Path) -> Section:
    """Time each case in fresh processes; the section."""
    from persistence import SqlStore

    path = workdir / "imports.db"
    url = f"sqlite:///{path}"
    SqlStore(url).close()
    cases = _cases(url)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_THIS), env.get("PYTHONPATH")]))
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(config.runs):
        order = list(cases) if i % 2 == 0 else list(reversed(cases))
        for name in order:
            took, used = _timed(cases[name], env)
            wall[name].append(took)
            cpu[name].append(used)
    rows, figures = [], {}
    for name in cases:
        w, c = spread(wall[name]), spread(cpu[name])
        goal = _GOALS.get(name)
        verdict = "" if goal is None else _verdict(w, c, goal)
        rows.append([f"`{name}`", _ms(w), _ms(c), verdict])
        figures[f"start-up wall s: {name}"] = w.median
        figures[f"start-up CPU s: {name}"] = c.median
    body = f"""\
Each case in a fresh interpreter, {config.runs} runs interleaved; wall from start to exit,
CPU the process's user + system time. The module set a command loads is tested
(`tests/test_import_cost.py`: no `sqlalchemy.orm`, no PostgreSQL dialect for a SQLite
store, nothing of the store or the runtime for `--help`); the time is only measured here.

{table(["case", "wall, median (min–max)", "CPU, median (min–max)", "goal"], rows)}
"""
    return Section(TITLE, body, {"figures": figures})


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=_THIS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}")
    return took, usage.ru_utime + usage.ru_stime


def _verdict(wall: Spread, cpu: Spread, goal: float) -> str:
    met = "met" if wall.median <= goal else "not met"
    return f"≤ {goal * 1e3:.0f} ms: {met} (wall); CPU {cpu.median / goal:.2f}× of it"


def _ms(value: Spread) -> str:
    return f"{value.median * 1e3:.0f} ms ({value.low * 1e3:.0f}–{value.high * 1e3:.0f})"
