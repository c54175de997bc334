"""``subagent-control top``: one line per live child, refreshed in place on a terminal until
``q``; plain frames when stdout is not a terminal."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import AgentHandle, SubagentControl
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_OK, EXIT_UNREACHABLE
from controlplane.cli._top import render
from tests.cli.cli_support import REPO_ROOT, sample_tree
from tests.fakes import FakeProvider
from tests.support import running_child

pytestmark = pytest.mark.timeout(60)

_READ_S = 20.0


def test_the_view_lists_busy_children_first_with_state_task_age_held_and_mailbox() -> None:
    lines = render(sample_tree(), source="/tmp/x.sock")

    assert lines[0].startswith("subagent-control top — /tmp/x.sock — ")
    assert lines[0].endswith("2 children: 1 running, 1 idle")
    assert lines[1].split() == [
        "CHILD", "STATE", "TASK", "AGE", "QUEUE", "TOKENS", "COST", "HELD", "MAILBOX", "PARENT"
    ]  # fmt: skip
    assert lines[2].split() == [
        "child-busy", "running", "task-7", "1.5s", "-", "0", "-", "1", "2", "parent-1"
    ]  # fmt: skip
    assert lines[3].split() == [
        "child-idle", "idle", "-", "-", "-", "-", "-", "0", "0", "parent-1"
    ]  # fmt: skip


def test_the_view_shows_a_queued_child_its_place_and_its_wait() -> None:
    tree = sample_tree()
    busy = tree.supervisors[1]
    assert busy.activation is not None
    queued = busy.model_copy(
        update={
            "child_id": "child-queued",
            "state": "starting",
            "task_id": "task-8",
            "task_status": "queued",
            "activation": busy.activation.model_copy(
                update={
                    "task_id": "task-8",
                    "published": False,
                    "task_status": "queued",
                    "queue_position": 2,
                    "queued_s": 3.25,
                }
            ),
        }
    )
    waited = busy.model_copy(
        update={"activation": busy.activation.model_copy(update={"queued_s": 0.5})}
    )
    tree = tree.model_copy(update={"supervisors": [tree.supervisors[0], waited, queued]})

    lines = render(tree, source="/tmp/x.sock")

    assert lines[0].endswith("3 children: 1 running, 1 queued, 1 idle")
    assert lines[3].split()[:6] == ["child-queued", "queued", "task-8", "1.5s", "#2", "3.2s"]
    assert lines[2].split()[:6] == ["child-busy", "running", "task-7", "1.5s", "waited", "0.5s"]


def test_without_a_terminal_top_prints_one_plain_frame_and_exits(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from controlplane._admin import AdminServer

    path = str(sock_dir / "admin.sock")
    with AdminServer(path, dump=sample_tree):
        status = main(["top", "--socket", path, "--iterations", "2", "--interval", "0.01"])
    out, err = capsys.readouterr()

    assert (status, err) == (EXIT_OK, "")
    assert "\x1b" not in out
    frames = out.split("\n\n")
    assert len(frames) == 2
    assert all("child-busy  running  task-7" in frame for frame in frames)


def test_top_on_a_missing_socket_is_unreachable(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--socket", str(sock_dir / "none.sock")]) == EXIT_UNREACHABLE
    assert "no admin socket" in capsys.readouterr().err


@pytest.fixture
def served(sqlite_url: str, sock_dir: Path) -> Iterator[tuple[SubagentControl, str]]:
    control = SubagentControl.open(sqlite_url)
    path = str(sock_dir / "admin.sock")
    try:
        control.serve_admin(path)
        yield control, path
    finally:
        control.close()


def test_top_in_a_terminal_shows_a_running_child_and_quits_on_q(
    served: tuple[SubagentControl, str], hold: threading.Event
) -> None:
    control, path = served
    provider = FakeProvider()
    control.providers.register(provider)
    parent: AgentHandle = control.agents.register("parent-1")
    child_id, task_id, _plan = running_child(control, parent, provider, hold)

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "top", "--socket", path, "--interval", "0.1"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        close_fds=True,
    )
    os.close(slave)
    try:
        screen = _read_until(master, child_id.encode())
        os.write(master, b"q")
        assert proc.wait(timeout=10) == EXIT_OK
        screen += _drain(master)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)

    text = screen.decode("utf-8", "replace")
    row = next(line for line in text.splitlines() if child_id in line)
    assert "running" in row
    assert task_id in row
    assert text.index("\x1b[?1049h") < text.index(child_id)  # drawn on the alternate screen
    assert text.rstrip().endswith("\x1b[?1049l")  # and the screen restored on the way out


def _read_until(fd: int, needle: bytes) -> bytes:
    seen = b""
    deadline = time.monotonic() + _READ_S
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"top never showed {needle!r}; it showed {seen[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            seen += os.read(fd, 65536)
    return seen


def _drain(fd: int) -> bytes:
    """What is left to read once the process has exited (EIO ends a pty's output)."""
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            return out
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk
