"""The examples run end to end, exactly as the README tells a newcomer to run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


@pytest.mark.timeout(150)
def test_quickstart_steers_restarts_resumes_and_kills(tmp_path: Path) -> None:
    out = run_example("quickstart.py", "--db", f"sqlite:///{tmp_path}/state.db")

    assert "route=steered" in out
    # The steered message joined the first turn: the answer saw two requests.
    assert "2 request(s) so far: find three facts about otters | focus on sea otters" in out
    # After the restart the resumed child still remembers both earlier requests.
    assert "route=started" in out
    assert "3 request(s) so far: find three facts about otters | focus on sea otters" in out
    assert "killed    killed by parent-1" in out
    # The tree was printed while activations were live.
    assert "activation" in out
    assert "(initial, published, running" in out  # research: published before the steer returned
    assert "steering/message     from coordinator" in out


@pytest.mark.timeout(150)
def test_human_and_parent_messages_share_one_turn_with_their_sources() -> None:
    out = run_example("human_and_parent.py")

    assert "steered into task" in out
    assert "message delivered to running task" in out
    assert "[status: completed]" in out
    transcript = out.split("the child's transcript")[1]
    assert "steering/message   human/alice" in transcript
    assert "steering/message   coordinator/parent-1" in transcript
    assert transcript.count("turn 1") == 3
