"""Smoke test of ``python -m benchmarks --quick``: it runs and writes its tables.

No timing is asserted here: the numbers are the benchmark's output, not a test's verdict.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support import run_python


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_benchmark_run_writes_a_report_with_every_section_table(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    plot = tmp_path / "resume_latency.png"

    done = run_python(
        "-m", "benchmarks", "--quick", "--out", str(out), "--plot", str(plot), timeout=280
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

    done = run_python("-m", "benchmarks", "--sections", "nope", "--out", str(out), timeout=60)

    assert done.returncode != 0
    assert "unknown section" in done.stderr
    assert not out.exists()
