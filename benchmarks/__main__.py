"""Run the benchmarks and write docs/benchmarks.md and docs/resume_latency.png.

Usage::

    .venv/bin/python -m benchmarks                  # everything (~17 minutes on 2 shared cores)
    .venv/bin/python -m benchmarks --quick          # smoke run (~40 s), numbers not citable
    .venv/bin/python -m benchmarks --sections routing,resume
    .venv/bin/python -m benchmarks --against ../base --rounds 3 --sections hops,resume
                                                    # this tree beside another checkout,
                                                    # alternating (see benchmarks._against)
    .venv/bin/python -m benchmarks --sections soak  # 10,000 idle children; a 20,000-turn
                                                    # soak (RSS, threads, objects)
    BENCH_SCALEOUT_LEVELS=4 .venv/bin/python -m benchmarks --sections scaleout
                                                    # the scale-out at 4 runtimes only
    .venv/bin/python -m benchmarks --profile        # also print where a steer, a
                                                    # 10,000-message resume, a warm resume
                                                    # and a stored tasks.get spend time

PostgreSQL figures use ``SUBAGENT_CONTROL_TEST_PG_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and are skipped, with a note, when
the server is unreachable.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks._harness import pg_server, scratch_dir
from benchmarks._machine import load_average, machine_lines
from benchmarks._report import Section, write_report

SECTIONS = (
    "routing", "hops", "resume", "scale", "tasks", "store", "children", "telemetry",
    "forwarding", "admission", "spend", "a2a", "fronts", "scaleout", "imports", "soak",
)  # fmt: skip
_DOCS = Path(__file__).resolve().parents[1] / "docs"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected sections and write the report; returns the exit status."""
    args = _parser().parse_args(argv)
    chosen = _sections(args.sections)
    if args.against is not None:
        return _against(args, chosen)
    pg_url, pg_note = (None, "disabled with --no-postgres") if args.no_postgres else pg_server()
    pg_version = pg_note if pg_url else None
    sections: list[Section] = []
    ran: dict[str, Section] = {}  # by --sections name: what the goals table reads
    started, load_before = time.monotonic(), load_average()
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with scratch_dir(keep=args.keep_scratch) as workdir:
        runners = _runners(args.quick, workdir, pg_url, pg_note, args.plot)
        for name in chosen:
            t0 = time.monotonic()
            _log(f"{name}: running")
            result = runners[name]()
            if result is None:
                _log(f"{name}: skipped (its module is not available); kept the old section")
                continue
            sections.append(result)
            ran[name] = result
            _log(f"{name}: done in {time.monotonic() - t0:.0f} s")
        if args.profile:
            from benchmarks._hotpaths import profile_hot_paths

            print(profile_hot_paths(workdir))
    if ran:
        sections.append(_goals(args, chosen, at, ran))
    load = f"{load_before} at the start, {load_average()} at the end"
    header = _header(args.quick, chosen, pg_version, time.monotonic() - started, load)
    write_report(args.out, header, sections)
    if args.figures_out is not None:
        from benchmarks._against import write_figures

        write_figures(args.figures_out, sections)
    _log(f"wrote {args.out}" + (f" and {args.plot}" if "resume" in chosen else ""))
    return 0


def _runners(
    quick: bool, workdir: Path, pg_url: str | None, pg_note: str, plot: Path
) -> dict[str, Callable[[], Section | None]]:
    def routing() -> Section:
        from benchmarks.routing import RoutingConfig, run_routing

        config = RoutingConfig.quick() if quick else RoutingConfig()
        return run_routing(config, workdir)

    def hops() -> Section:
        from benchmarks.hops import HopsConfig, run_hops

        return run_hops(HopsConfig.quick() if quick else HopsConfig(), workdir)

    def resume() -> Section:
        from benchmarks._plot import plot_resume
        from benchmarks.resume import ResumeConfig, run_resume

        config = ResumeConfig.quick() if quick else ResumeConfig()
        section = run_resume(config, workdir, pg_url, pg_note)
        note = "median of runs, bars min–max" + (" — quick run" if quick else "")
        try:
            plot_resume(section.data["series"], plot, title_note=note)  # type: ignore[arg-type]
        except ImportError:
            _log("resume: matplotlib is not installed (pip install -e '.[bench]'); no plot")
        return section

    def scale() -> Section:
        from benchmarks.scale import ScaleConfig, run_scale

        config = ScaleConfig.quick() if quick else ScaleConfig()
        return run_scale(config, workdir)

    def tasks() -> Section:
        from benchmarks.tasks import TasksConfig, run_tasks

        return run_tasks(TasksConfig.quick() if quick else TasksConfig(), workdir)

    def store() -> Section | None:
        from benchmarks._store_adapter import run_store_section

        return run_store_section(quick=quick, workdir=workdir, pg_url=pg_url)

    def children() -> Section | None:
        from benchmarks.children import ChildrenConfig, run_children

        return run_children(ChildrenConfig.quick() if quick else ChildrenConfig())

    def telemetry() -> Section | None:
        from benchmarks.telemetry import TelemetryConfig, run_telemetry

        return run_telemetry(TelemetryConfig.quick() if quick else TelemetryConfig(), workdir)

    def forwarding() -> Section:
        from benchmarks.forwarding import ForwardingConfig, run_forwarding

        config = ForwardingConfig.quick() if quick else ForwardingConfig()
        return run_forwarding(config, pg_url, pg_note)

    def admission() -> Section:
        from benchmarks.admission import AdmissionConfig, run_admission

        config = AdmissionConfig.quick() if quick else AdmissionConfig()
        return run_admission(config, workdir, pg_url, pg_note)

    def spend() -> Section:
        from benchmarks.spend import SpendConfig, run_spend

        return run_spend(SpendConfig.quick() if quick else SpendConfig(), workdir, pg_url, pg_note)

    def a2a() -> Section | None:
        if not _has("a2a", "httpx"):  # the a2a extra is missing: no section
            return None
        from benchmarks.a2a import A2AConfig, run_a2a

        return run_a2a(A2AConfig.quick() if quick else A2AConfig(), workdir, pg_url)

    def fronts() -> Section | None:
        if not _has("mcp"):  # the mcp extra is missing: no section
            return None
        from benchmarks.fronts import FrontsConfig, run_fronts

        config = FrontsConfig.quick() if quick else FrontsConfig()
        return run_fronts(config, workdir, pg_url, pg_note)

    def scaleout() -> Section:
        from benchmarks.scaleout import ScaleoutConfig, plot_scaleout, run_scaleout

        config = ScaleoutConfig.quick() if quick else ScaleoutConfig()
        levels = os.environ.get("BENCH_SCALEOUT_LEVELS")  # e.g. "4": one level only
        if levels:
            config = replace(config, levels=tuple(int(n) for n in levels.split(",")))
        section = run_scaleout(config, pg_url, pg_note)
        results = section.data.get("results")
        if results:
            try:
                note = "quick run" if quick else "one run"
                curve = plot.parent / "scaleout.png"
                plot_scaleout(results, curve, title_note=note)  # type: ignore[arg-type]
            except ImportError:
                _log("scaleout: matplotlib is not installed (pip install -e '.[bench]'); no plot")
        return section

    def soak() -> Section:
        from benchmarks.soak import SoakConfig, run_soak

        return run_soak(SoakConfig.quick() if quick else SoakConfig(), workdir)

    def imports() -> Section:
        from benchmarks.imports import ImportsConfig, run_imports

        return run_imports(ImportsConfig.quick() if quick else ImportsConfig(), workdir)

    return {
        "soak": soak,
        "imports": imports,
        "scaleout": scaleout,
        "a2a": a2a,
        "fronts": fronts,
        "admission": admission,
        "spend": spend,
        "routing": routing,
        "hops": hops,
        "resume": resume,
        "scale": scale,
        "tasks": tasks,
        "store": store,
        "children": children,
        "telemetry": telemetry,
        "forwarding": forwarding,
    }


def _goals(
    args: argparse.Namespace, chosen: list[str], at: str, ran: dict[str, Section]
) -> Section:
    """The goals table: this run's figures kept beside the report, over the last run's of
    the sections it did not run (`benchmarks._goals`)."""
    from benchmarks._goals import FIGURES_FILE, goals_section, record_figures

    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    if chosen != list(SECTIONS):
        command += f" --sections {','.join(chosen)}"
    kept = record_figures(
        args.out.with_name(FIGURES_FILE), at=at, command=command, quick=args.quick, ran=ran
    )
    return goals_section(kept, at=at)


def _against(args: argparse.Namespace, chosen: list[str]) -> int:
    """``--against PATH``: the comparison section, written into the report."""
    from benchmarks._against import run_against

    started, load_before = time.monotonic(), load_average()
    section = run_against(
        args.against, chosen, rounds=args.rounds, quick=args.quick, no_postgres=args.no_postgres
    )
    pg_url, pg_note = (None, "disabled with --no-postgres") if args.no_postgres else pg_server()
    load = f"{load_before} at the start, {load_average()} at the end"
    header = _header(
        args.quick,
        [*chosen, f"against {args.against}"],
        pg_note if pg_url else None,
        time.monotonic() - started,
        load,
    )
    write_report(args.out, header, [section])
    _log(f"wrote {args.out}")
    return 0


def _header(
    quick: bool, chosen: list[str], pg_version: str | None, took_s: float, load: str
) -> str:
    command = "python -m benchmarks" + (" --quick" if quick else "")
    refreshed = (
        ""
        if list(chosen) == list(SECTIONS)
        else f"\nThis run refreshed: {', '.join(chosen)}; the other sections are from an "
        "earlier run.\n"
    )
    warning = (
        "\n**Quick smoke run: too few samples to cite; run without `--quick`.**\n" if quick else ""
    )
    machine = "\n".join([*machine_lines(pg_version), f"- 1-minute load average: {load}"])
    return f"""\
# Benchmarks

Written by `{command}` (took {took_s:.0f} s); re-run it rather than editing this file.
{warning}{refreshed}
{machine}

The sections this command does not write (*Against another tree*, from an `--against` run;
*Console*, *Recovery and handover* and *Walk of a steer and a cold resume*, from their own
commands) are kept from their runs, each naming its command.

Method: every figure is the median over several runs, with the runs' min–max in
brackets; a ratio is computed inside each run, where both sides were measured back to back
in the same process, then summarised the same way. Durations use `time.perf_counter`.
The test suite makes no timing assertions; these numbers are the performance record.

Against an earlier version: `python -m benchmarks --against PATH [--rounds N] --sections
LIST` runs the sections on this tree and on the packages at PATH (another worktree, or a
commit exported with `git archive COMMIT | tar -x -C PATH`) in N alternating rounds (A B,
B A, …), each side in a fresh process, both measured by this tree's benchmark code, and
writes the section *Against another tree*: each headline figure on both sides and its
ratio this / other, taken inside each round (a range that spans 1× is noise). That is how
"no regression beyond noise against the commit before this work" is checked; the hop and
transaction counts it compares are exact.
"""


def _sections(raw: str | None) -> list[str]:
    if not raw:
        return list(SECTIONS)
    chosen = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return [name for name in SECTIONS if name in chosen]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (~40 s)")
    parser.add_argument(
        "--sections",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all); the report "
        "keeps the other sections from its previous version",
    )
    parser.add_argument(
        "--out", type=Path, default=_DOCS / "benchmarks.md", help="report path (Markdown)"
    )
    parser.add_argument(
        "--plot", type=Path, default=_DOCS / "resume_latency.png", help="resume plot (PNG)"
    )
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL figures")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print cProfile reports of a steer, a 10,000-message cold resume, a warm "
        "resume and a tasks.get of a Task only the store holds",
    )
    parser.add_argument("--keep-scratch", action="store_true", help="keep the temporary databases")
    parser.add_argument(
        "--against",
        metavar="PATH",
        type=Path,
        help="also run the sections on the packages of another checkout at PATH (a worktree, "
        "or `git archive COMMIT | tar -x -C PATH`), alternating with this tree round by "
        "round, and write the ratios of their headline figures (section 'Against another "
        "tree')",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds for --against (default 3)"
    )
    parser.add_argument("--figures-out", type=Path, help=argparse.SUPPRESS)  # --against's sides
    return parser


def _log(message: str) -> None:
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)


def _has(*modules: str) -> bool:
    """Whether every one of ``modules`` can be imported (an optional extra is installed)."""
    return all(importlib.util.find_spec(name) is not None for name in modules)


if __name__ == "__main__":
    sys.exit(main())
