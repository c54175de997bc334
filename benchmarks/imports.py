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

The processes run with their bytecode cached (a scratch ``PYTHONPYCACHEPREFIX``, filled by
one untimed run of each case), as an installed package has it: with
``PYTHONDONTWRITEBYTECODE`` set and a checkout's sources, every process would compile
every module of ours again, which is not what a user's command pays.

``python -m benchmarks.imports --baseline PATH`` also runs the three cases of ours on the
packages at PATH (another worktree, or ``git archive COMMIT | tar -x -C PATH``),
interleaved process by process with this tree's, and gives each case's ratio this / PATH,
taken inside each run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, spread

__all__ = ["ImportsConfig", "run_imports"]

TITLE = "Start-up and imports"
IMPORT_GOAL_S = 0.250
COMMAND_GOAL_S = 0.300
_IMPORT = "from controlplane import SubagentControl"
_HELP = "subagent-control --help"
_TASKS = "subagent-control tasks (SQLite)"
_GOALS = {_IMPORT: IMPORT_GOAL_S, _HELP: COMMAND_GOAL_S, _TASKS: COMMAND_GOAL_S}


@dataclass(frozen=True)
class ImportsConfig:
    """How many fresh processes per case, and the tree to compare with (if any)."""

    runs: int = 9
    baseline: Path | None = None

    @classmethod
    def quick(cls) -> ImportsConfig:
        """A smoke run."""
        return cls(runs=2)


@dataclass(frozen=True)
class _Case:
    name: str
    argv: list[str]
    env: dict[str, str]
    tree: str  # "this", "baseline", or "" for a case that runs none of ours


def _tree_of_this_process() -> Path:
    """The directory this process's packages come from (under ``--against``, the other
    checkout's): the processes measured import the same ones."""
    import persistence

    return Path(persistence.__file__).resolve().parents[1]


def _environment(tree: Path, pycache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    return env


def _prepare(tree: Path, env: dict[str, str], url: str) -> None:
    """Check that ``env`` imports ``tree``'s packages, and make the store with its code."""
    probe = (
        "import persistence, sys\n"
        f"assert persistence.__file__.startswith({str(tree)!r}), persistence.__file__\n"
        f"persistence.SqlStore({url!r}).close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot run {tree}'s packages: {done.stderr}")


def _cases(trees: dict[str, Path], workdir: Path) -> list[_Case]:
    py = sys.executable
    cli = "from controlplane.cli import main; raise SystemExit(main())"
    pycache = workdir / "pycache"
    cases: list[_Case] = []
    for label, tree in trees.items():
        env = _environment(tree, pycache)
        url = f"sqlite:///{workdir / f'imports-{label}.db'}"
        _prepare(tree, env, url)
        if label == "this":
            cases += [
                _Case("python -c pass", [py, "-c", "pass"], env, ""),
                _Case("import pydantic", [py, "-c", "import pydantic"], env, ""),
                _Case("import sqlalchemy", [py, "-c", "import sqlalchemy"], env, ""),
            ]
        cases += [
            _Case(_IMPORT, [py, "-c", _IMPORT], env, label),
            _Case(_HELP, [py, "-c", cli, "--help"], env, label),
            _Case(_TASKS, [py, "-c", cli, "tasks", "--db", url], env, label),
        ]
    return cases


def run_imports(config: ImportsConfig, workdir: Path) -> Section:
    """Time each case in fresh processes; the section."""
    trees = {"this": _tree_of_this_process()}
    if config.baseline is not None:
        trees["baseline"] = config.baseline.resolve()
    cases = _cases(trees, workdir)
    for case in cases:  # untimed: fills the bytecode cache
        _timed(case)
    wall: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    cpu: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    for run in range(config.runs):
        order = list(range(len(cases)))
        for i in order if run % 2 == 0 else reversed(order):
            took, used = _timed(cases[i])
            wall[i].append(took)
            cpu[i].append(used)
    rows, figures = [], {}
    for i, case in enumerate(cases):
        if case.tree == "baseline":
            continue
        w, c = spread(wall[i]), spread(cpu[i])
        goal = _GOALS.get(case.name)
        verdict = "" if goal is None else _verdict(w, c, goal)
        rows.append([f"`{case.name}`", _ms(w), _ms(c), verdict])
        figures[f"start-up wall s: {case.name}"] = w.median
        figures[f"start-up CPU s: {case.name}"] = c.median
    body = f"""\
Each case in a fresh interpreter, {config.runs} runs interleaved, bytecode cached (as an
installed package has it); wall from start to exit, CPU the process's user + system time.
The module set a command loads is tested (`tests/test_import_cost.py`: no SQLAlchemy, no
`persistence` module, no actor system and no pydantic for the public import, nothing of the
store, the runtime or pydantic for `--help`, no ORM and no PostgreSQL dialect for `tasks`
on SQLite); the time is only measured here.

{table(["case", "wall, median (min–max)", "CPU, median (min–max)", "goal"], rows)}
"""
    if config.baseline is not None:
        body += "\n" + _comparison(cases, wall, cpu, config.baseline, figures)
    return Section(TITLE, body, {"figures": figures})


def _comparison(
    cases: list[_Case],
    wall: dict[int, list[float]],
    cpu: dict[int, list[float]],
    baseline: Path,
    figures: dict[str, float],
) -> str:
    index = {(case.tree, case.name): i for i, case in enumerate(cases)}
    rows = []
    for name in _GOALS:
        this, other = index["this", name], index["baseline", name]
        cpu_ratio = spread([a / b for a, b in zip(cpu[this], cpu[other], strict=True)])
        wall_ratio = spread([a / b for a, b in zip(wall[this], wall[other], strict=True)])
        figures[f"start-up CPU this / baseline: {name}"] = cpu_ratio.median
        rows.append([
            f"`{name}`", _ms(spread(cpu[this])), _ms(spread(cpu[other])),
            fmt_ratio(cpu_ratio), fmt_ratio(wall_ratio),
        ])  # fmt: skip
    return f"""\
Against `{baseline}`, the same cases on its packages, each run's processes interleaved
with this tree's; a ratio is this / that, taken inside each run:

{table(["case", "CPU, this", "CPU, baseline", "CPU this / baseline", "wall this / baseline"], rows)}
"""


def _timed(case: _Case) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        case.argv, cwd=case.env["PYTHONPATH"].split(os.pathsep)[0], env=case.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _pid, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{case.argv} exited {proc.returncode}")
    return took, usage.ru_utime + usage.ru_stime


def _verdict(wall: Spread, cpu: Spread, goal: float) -> str:
    met = "met" if wall.median <= goal else "not met"
    return f"≤ {goal * 1e3:.0f} ms: {met} (wall); CPU {cpu.median / goal:.2f}× of it"


def _ms(value: Spread) -> str:
    return f"{value.median * 1e3:.0f} ms ({value.low * 1e3:.0f}–{value.high * 1e3:.0f})"


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.imports [--runs N] [--baseline PATH]``: print the section."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.imports", description=__doc__)
    parser.add_argument("--runs", type=int, default=ImportsConfig.runs)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="subagent-imports-") as scratch:
        section = run_imports(ImportsConfig(runs=args.runs, baseline=args.baseline), Path(scratch))
    print(f"## {section.title}\n\n{section.body}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
