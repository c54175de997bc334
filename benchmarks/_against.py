"""``--against PATH``: this tree beside another checkout, in alternating runs.

Each round runs the chosen sections twice, each time in a fresh process: once on this
tree's packages, once on PATH's (``controlplane``, ``actors``, ``persistence`` imported from
PATH), in an order that alternates between rounds (A B, B A, A B …), so a drift of the
machine's load favours neither. Both sides run *this* tree's benchmark code, so they
measure the same thing the same way (and a section added here, such as the hop counts,
measures the older code too). Each section reports its headline figures
(``Section.data["figures"]``); a figure's ratio this / PATH is taken inside each round and
summarised over the rounds (median, min–max), as every ratio in the report is.

PATH is any directory holding the three packages: a second worktree, or a commit exported
with ``git archive COMMIT | tar -x -C DIR``. A section that fails on one side (say, it
needs an API the older code lacks) is named in the report with its error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, spread

__all__ = ["FIGURES_OPTION", "flat_figures", "run_against", "write_figures"]

FIGURES_OPTION = "--figures-out"
"""The option a side's process writes its sections' figures with (a JSON file)."""

_THIS = Path(__file__).resolve().parents[1]

# Run in a side's process: PATH's packages first on sys.path, this tree's `benchmarks`
# loaded from its own directory (PATH may have a `benchmarks` of its own), then `main`.
_BOOT = """\
import importlib.util, sys
tree, here, *argv = sys.argv[1:]
sys.path[:0] = [tree]
spec = importlib.util.spec_from_file_location(
    "benchmarks", here + "/benchmarks/__init__.py",
    submodule_search_locations=[here + "/benchmarks"],
)
module = importlib.util.module_from_spec(spec)
sys.modules["benchmarks"] = module
spec.loader.exec_module(module)
import persistence
if not persistence.__file__.startswith(tree):
    sys.exit(f"persistence was imported from {persistence.__file__}, not from {tree}")
from benchmarks.__main__ import main
sys.exit(main(argv))
"""


def run_against(
    other: Path, sections: Sequence[str], *, rounds: int, quick: bool, no_postgres: bool
) -> Section:
    """Run ``sections`` on both trees ``rounds`` times, alternating; the comparison."""
    other = other.resolve()
    for package in ("controlplane", "actors", "persistence"):
        if not (other / package / "__init__.py").exists():
            raise SystemExit(f"--against {other}: no {package}/ package there")
    sides = {"this": _THIS, "other": other}
    figures: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="subagent-against-") as scratch:
        for number in range(rounds):
            order = ["this", "other"] if number % 2 == 0 else ["other", "this"]
            for side in order:
                _log(f"against: round {number + 1}/{rounds}, {side} tree ({sides[side]})")
                found, error = _run_side(
                    sides[side], sections, Path(scratch), quick=quick, no_postgres=no_postgres
                )
                figures[side].append(found)
                if error:
                    failures.append(f"round {number + 1}, {side} tree: {error}")
    return Section(
        "Against another tree", _body(other, sections, rounds, figures, failures, quick=quick)
    )


def _run_side(
    tree: Path, sections: Sequence[str], scratch: Path, *, quick: bool, no_postgres: bool
) -> tuple[dict[str, float], str | None]:
    out = scratch / "figures.json"
    out.unlink(missing_ok=True)
    argv = [
        "--sections", ",".join(sections),
        "--out", str(scratch / "report.md"),
        "--plot", str(scratch / "plot.png"),
        FIGURES_OPTION, str(out),
    ]  # fmt: skip
    if quick:
        argv.append("--quick")
    if no_postgres:
        argv.append("--no-postgres")
    # cwd: the scratch directory, so that neither tree is importable from the cwd.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _BOOT, str(tree), str(_THIS), *argv],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found: dict[str, float] = json.loads(out.read_text()) if out.exists() else {}
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return found, tail[0]
    return found, None


def _body(
    other: Path,
    sections: Sequence[str],
    rounds: int,
    figures: dict[str, list[dict[str, float]]],
    failures: list[str],
    *,
    quick: bool,
) -> str:
    names: dict[str, None] = {}  # every figure either side reported, in first-seen order
    for found in figures["this"] + figures["other"]:
        names |= dict.fromkeys(found)
    rows = []
    for name in names:
        this = [f[name] for f in figures["this"] if name in f]
        theirs = [f[name] for f in figures["other"] if name in f]
        pairs = [
            (a[name], b[name])
            for a, b in zip(figures["this"], figures["other"], strict=True)
            if name in a and name in b
        ]
        # A count that is 0 on both sides (a steer's hops) is the same: 1×.
        ratios = [a / b if b else 1.0 for a, b in pairs if b or not a]
        ratio = fmt_ratio(spread(ratios)) if ratios else "—"
        rows.append([name, _fmt(name, this), _fmt(name, theirs), ratio])
    failed = "".join(f"\n- {failure}" for failure in failures)
    return f"""\
`python -m benchmarks --against {other} --rounds {rounds} --sections {",".join(sections)}`
{"(quick configs) " if quick else ""}— this tree against the packages at `{other}`, both
run by this tree's benchmark code in {rounds} alternating rounds (a fresh process per
side and round). Each figure: median over the rounds (min–max); the ratio this / other is
taken inside each round. Counts (messages, hops, transactions per operation) are exact;
times on a shared machine move by tens of percent between rounds, so a ratio whose range
spans 1× is noise.
{failed}

{table(["figure", "this tree", "other tree", "this / other"], rows)}
"""


def _fmt(name: str, values: list[float]) -> str:
    if not values:
        return "—"
    if "p50" in name or "to provider.resume" in name:
        return fmt_s(spread(values))
    middle = spread(values)
    if "/" in name:
        return fmt_ratio(middle)
    return f"{middle.median:.2f}".rstrip("0").rstrip(".")


def write_figures(path: Path, sections: Sequence[Section]) -> None:
    """Write the sections' figures to ``path`` (JSON): what a side hands back."""
    found: dict[str, float] = {}
    for section in sections:
        raw = section.data.get("figures")
        if isinstance(raw, dict):
            found |= dict(_flat("", raw))
    path.write_text(json.dumps(found), encoding="utf-8")


def flat_figures(figures: dict[str, object]) -> Iterator[tuple[str, float]]:
    """A section's ``data["figures"]`` as named numbers (see `_flat`)."""
    return _flat("", figures)


def _flat(prefix: str, value: object) -> Iterator[tuple[str, float]]:
    """A section's figures as named numbers: nested tables (the spend section's backend →
    operation → variant) joined into one name, a spread as its median (a time, ``p50``)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flat(f"{prefix} {key}".strip(), inner)
    elif isinstance(value, Spread):
        yield f"{prefix} p50", value.median
    else:
        yield prefix, float(value)  # type: ignore[arg-type]


def _log(message: str) -> None:
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)
