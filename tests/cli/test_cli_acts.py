"""The command line acts: ``send`` (a person's message: steered or started), ``kill``,
``transcript --follow`` and ``tasks --watch``, against a runtime in another process
(``act_holder.py``), on both backends. On PostgreSQL a send to, or a kill of, a turn
running in the other process is forwarded there; on SQLite it is refused
``OWNERSHIP_CONFLICT``, naming that process (SPEC §9), and changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_FAILURE, EXIT_OK
from persistence import SqlStore
from tests.reliability.processes import REPO, LinesProcess, Reaper, reaping

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

HOLDER = Path(__file__).with_name("act_holder.py")
reaped = pytest.fixture(reaping, name="reaped")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def events(url: str, child_id: str) -> list[tuple[str, str | None, str]]:
    """The child's events: (kind, source kind, text)."""
    with SqlStore(url, read_only=True) as store:
        found = store.load(child_id).events
    return [(e.kind, e.source.kind if e.source else None, json.dumps(e.data)) for e in found]


class Follower:
    """``subagent-control transcript CHILD --follow`` in its own process."""

    def __init__(self, url: str, child_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "transcript", child_id[:8], "--db", url,
             "--follow", "--interval", "0.1"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def wait_for(self, *texts: str, lines: int = 200) -> str:
        """Read lines until one holds each of ``texts`` (bounded by count; the test's
        timeout bounds the time)."""
        assert self.proc.stdout is not None
        for _ in range(lines):
            line = self.proc.stdout.readline()
            err = self.proc.stderr.read() if self.proc.stderr and not line else ""
            assert line, f"the follower ended: {err}"
            if all(text in line for text in texts):
                return line
        pytest.fail(f"{texts!r} not followed within {lines} lines")

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, as a person ends it: the exit status and stderr."""
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode, err


def test_a_person_sends_kills_and_follows_from_the_command_line(
    store_url: str, reaped: Reaper, capsys: pytest.CaptureFixture[str]
) -> None:
    postgres = store_url.startswith("postgresql")
    holder = reaped.add(LinesProcess(HOLDER, store_url, name="act holder"))
    idle_child = holder.expect("idle ")
    child_id, task_id = holder.expect("running ").split()

    # tasks --watch: frames of the list, the running Task in each.
    status, out, _ = run(capsys, "tasks", "--db", store_url, "--watch", "--interval", "0.1",
                         "--iterations", "2")  # fmt: skip
    assert status == EXIT_OK
    frames = out.split("\n\ntasks at ")
    assert len(frames) == 2
    assert all(task_id in frame and "running" in frame for frame in frames)

    # send to the idle child: it resumes in this command's runtime (the --setup gives it
    # the child's provider), which waits for the turn to settle.
    follower = Follower(store_url, idle_child)
    try:
        follower.wait_for("idle one")  # the transcript so far
        setup = "tests.cli.act_setup:register"
        status, out, err = run(capsys, "send", idle_child[:8], "and one more thing",
                               "--db", store_url, "--setup", setup)  # fmt: skip
        assert status == EXIT_OK, err
        started, settled = out.splitlines()
        assert started.startswith("started task ")
        assert settled.endswith("completed: resumed by the cli")
        follower.wait_for("/message  human  ", "and one more thing")
        follower.wait_for("resumed by the cli")
    finally:
        code, err = follower.stop()
    assert code == EXIT_OK, err
    assert "Traceback" not in err
    idle_events = events(store_url, idle_child)
    assert any(s == "human" and "and one more thing" in t for _, s, t in idle_events)

    # send to the running child: steered in the other process (PostgreSQL), or refused.
    status, out, err = run(capsys, "send", child_id, "steer this", "--db", store_url)
    if postgres:
        assert (status, out) == (EXIT_OK, f"steered task {task_id} of child {child_id}\n"), err
        assert any(s == "human" and "steer this" in t for _, s, t in events(store_url, child_id))
    else:
        assert status == EXIT_FAILURE
        assert "[OWNERSHIP_CONFLICT]" in err
        assert "runtime" in err
        assert not any("steer this" in t for _, _, t in events(store_url, child_id))

    # kill the running Task: killed in the other process (PostgreSQL), or refused.
    status, out, err = run(capsys, "kill", task_id[:8], "--db", store_url)
    if postgres:
        assert status == EXIT_OK, err
        assert out.splitlines()[-1].startswith(f"task {task_id} killed")
        assert holder.expect("settled ") == "killed"
    else:
        assert status == EXIT_FAILURE
        assert "[OWNERSHIP_CONFLICT]" in err
        holder.say("release")
        assert holder.expect("settled ") == "completed"
    status, out, _ = run(capsys, "kill", task_id, "--db", store_url)  # settled: nothing to do
    assert status == EXIT_OK
    assert "already" in out
