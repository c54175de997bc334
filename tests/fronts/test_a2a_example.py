"""examples/a2a_front.py runs end to end as its docstring tells a newcomer to run it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO

pytest.importorskip("a2a", reason="the A2A front needs the 'a2a' extra")


@pytest.mark.timeout(150)
@pytest.mark.slow  # measured: 17 s under load (--durations)
def test_the_a2a_example_starts_steers_follows_and_resumes() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "a2a_front.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "steered: the same task answered: True" in done.stdout
    assert "output: echo: also cover the safety bicycle" in done.stdout
    assert "resumed as a new task: True, same context: True" in done.stdout
    assert "TASK_STATE_COMPLETED: echo: summarise in one line" in done.stdout
