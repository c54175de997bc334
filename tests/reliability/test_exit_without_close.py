"""A script that exits without ``close()`` exits, and leaves a consistent store.

Real interpreters (`exit_child.py`): one returns from ``main`` with a child mid-turn, one
dies of a ``BrokenPipeError`` when its reader goes (a demo piped to ``head``), one's model
ignores the kill. Each must exit within the bound of the close at exit
(`controlplane.runtime._exit`); afterwards its turn is handed over: the next process with the
child's provider finishes the same Task in that turn, and the child goes on.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane import InProcessProvider, ScriptedModel, SubagentControl, TaskStatus, TextBlock
from controlplane.runtime._exit import EXIT_CLOSE_S, EXIT_GRACE_S
from tests.reliability.processes import REPO
from tests.support import WAIT_S, kinds

EXIT_CHILD = Path(__file__).with_name("exit_child.py")
PARENT = "exit-parent"
EXIT_BOUND_S = EXIT_CLOSE_S + EXIT_GRACE_S + 10.0
"""From the child mid-turn to the process gone: the close at exit's bound, plus the
interpreter's own teardown on a loaded two-core machine."""


class ExitChild:
    """``exit_child.py`` in ``mode``, its stdout a pipe; killed and reaped by `reap`."""

    def __init__(self, url: str, mode: str, stderr: Path) -> None:
        self._err = stderr.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(EXIT_CHILD), url, mode],
            stdout=subprocess.PIPE,
            stderr=self._err,
            cwd=REPO,
            text=True,
        )

    def mid_turn(self) -> tuple[str, str]:
        """Wait for its ``MID`` line; the child's and the Task's ids."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test's timeout
        assert line.startswith("MID "), f"said {line!r}"
        child_id, task_id = line.split()[1:3]
        return child_id, task_id

    def close_stdout(self) -> None:
        """Its reader goes: its next write raises ``BrokenPipeError``."""
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def exited_within(self, bound_s: float) -> float:
        """Seconds until it exited; fails if it is still alive after ``bound_s``."""
        began = time.monotonic()
        try:
            self.proc.wait(bound_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {bound_s:g} s after its main ended")
        return time.monotonic() - began

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def run_child(url: str, mode: str, tmp_path: Path) -> tuple[str, str, float]:
    child = ExitChild(url, mode, tmp_path / f"{mode}.stderr")
    try:
        child_id, task_id = child.mid_turn()
        if mode == "pipe":
            child.close_stdout()
        took = child.exited_within(EXIT_BOUND_S)
    finally:
        child.reap()
    return child_id, task_id, took


def assert_settled_and_continuable(url: str, child_id: str, task_id: str) -> None:
    """The dead script's running turn is handed over (SPEC §9): the next runtime to open
    the store with the child's provider carries the same Task on to its end, in the same
    turn, closed once; the child then goes on."""
    with SubagentControl.open(url) as control:  # the next open recovers what is left
        control.providers.register(InProcessProvider(ScriptedModel(["back"])))
        parent = control.agents.register(PARENT)
        snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert snapshot.status is TaskStatus.COMPLETED, snapshot
        assert snapshot.recoveries == 1
        assert control.store is not None
        stored = control.store.load(child_id).events
        assert kinds(stored).count("turn/start") == kinds(stored).count("turn/end") == 1
        assert stored[-1].kind == "turn/end"
        follow_up = control.send_message(parent, child_id, [TextBlock(text="again")])
        assert follow_up.route == "started"
        done = control.tasks.wait(follow_up.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED
        turns = [e.turn for e in control.store.load(child_id).events if e.kind == "turn/start"]
        assert turns == [1, 2]


@pytest.mark.parametrize("mode", ["return", "pipe"])
@pytest.mark.slow  # measured: 16 s under load (--durations)
def test_a_script_that_ends_without_close_exits_and_its_child_is_settled(
    mode: str, store_url: str, tmp_path: Path
) -> None:
    url = store_url

    child_id, task_id, _took = run_child(url, mode, tmp_path)

    assert_settled_and_continuable(url, child_id, task_id)


@pytest.mark.slow  # measured: 14 s under load (--durations)
def test_a_script_whose_model_ignores_the_kill_still_exits_within_the_bound(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"

    child_id, task_id, took = run_child(url, "stuck", tmp_path)

    assert took < EXIT_BOUND_S
    # Left as a crash leaves it, never settled over its open turn: the next open carries
    # it on (recovered) and closes the turn before the child's next one.
    assert_settled_and_continuable(url, child_id, task_id)
