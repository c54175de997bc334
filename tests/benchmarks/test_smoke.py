"""Smoke test of ``python -m benchmarks --quick``: it runs and writes its tables.

No timing is asserted here: the numbers are the benchmark's output, not a test's verdict.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_benchmark_run_writes_a_report_with_every_section_table(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    plot = tmp_path / "resume_latency.png"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out), "--plot", str(plot)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text(encoding="utf-8")
    for heading in ("## Routing", "## Cold resume", "## Scale"):
        assert heading in report, f"{heading} missing from the report"
    assert "| live children | steer p50 |" in report
    assert "| messages |" in report
    assert "Quick smoke run" in report
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0


def test_an_unknown_section_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--sections", "nope", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode != 0
    assert "unknown section" in done.stderr
    assert not out.exists()
