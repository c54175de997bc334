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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import ActorTree, AgentHandle, SubagentControl
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
        "CHILD", "STATE", "TASK", "AGE", "QUEUE", "TOKENS", "COST", "HELD", "MAILBOX", "PARENT",
        "LABEL",
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


def _uuid_tree(states: list[str], parent: str = "parent-1") -> ActorTree:
    """Children with uuid ids, one per Task status in ``states``, an hour into their turn."""
    base = sample_tree()
    busy = base.supervisors[1]
    assert busy.activation is not None
    nodes = []
    for status in states:
        task_id = str(uuid.uuid4())
        activation = busy.activation.model_copy(
            update={
                "task_id": task_id,
                "task_status": status,
                "age_s": 4000.0,
                "queue_position": 2 if status == "queued" else None,
                "queued_s": None if status == "running" else 3.25,
            }
        )
        nodes.append(
            busy.model_copy(
                update={
                    "child_id": str(uuid.uuid4()),
                    "task_id": task_id,
                    "task_status": status,
                    "activation": activation,
                    "parent_session": parent,
                    "held_messages": 12,
                    "mailbox_depth": 345,
                }
            )
        )
    return base.model_copy(update={"supervisors": nodes})


_STATES = ["running", "input_required", "queued"]
_HEADER = [
    "CHILD", "STATE", "TASK", "AGE", "QUEUE", "TOKENS", "COST", "HELD", "MAILBOX", "PARENT", "LABEL"
]  # fmt: skip


def test_at_80_columns_a_row_keeps_age_held_mailbox_and_parent_and_shortens_the_ids() -> None:
    tree = _uuid_tree(["running", "queued"])

    lines = render(tree, source="/tmp/x.sock", width=80)

    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].split() == _HEADER
    for node in tree.supervisors:
        assert node.task_id is not None
        row = next(line for line in lines if line.startswith(node.child_id[:8] + " "))
        cells = row.split()
        assert cells[0] == node.child_id[:8]  # a prefix `transcript` accepts
        assert cells[2] == node.task_id[:8]
        assert cells[3] == "1h06m"
        assert cells[-3:] == ["12", "345", "parent-1"]


def test_at_80_columns_a_long_parent_session_is_clipped_not_the_columns_before_it() -> None:
    long_parent = "a-parent-session-with-a-long-descriptive-name"
    tree = _uuid_tree(_STATES, parent=long_parent)

    lines = render(tree, source="/tmp/a/socket/path/that/is/long/admin.sock", width=80)

    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].endswith("3 children: 1 running, 1 input_required, 1 queued")
    for node in tree.supervisors:
        row = next(line for line in lines if line.startswith(node.child_id[:8] + " "))
        cells = row.split()
        assert cells[3] == "1h06m"
        assert cells[-3:-1] == ["12", "345"]
        assert cells[-1].endswith("…")
        assert long_parent.startswith(cells[-1][:-1])


def test_at_200_columns_or_wide_ids_and_sessions_are_whole() -> None:
    long_parent = "a-parent-session-with-a-long-descriptive-name"
    tree = _uuid_tree(_STATES, parent=long_parent)

    for lines in (
        render(tree, source="/tmp/x.sock", width=200),
        render(tree, source="/tmp/x.sock"),
    ):
        assert all(len(line) <= 200 for line in lines), lines
        for node in tree.supervisors:
            row = next(line for line in lines if line.startswith(node.child_id + " "))
            assert row.split()[2] == node.task_id
            assert row.split()[-1] == long_parent


def test_ids_that_share_their_first_characters_are_shown_long_enough_to_tell_apart() -> None:
    tree = _uuid_tree(["running", "running"])
    first, second = (
        node.model_copy(update={"child_id": f"abcdef0123{digit * 26}"})
        for node, digit in zip(tree.supervisors, "01", strict=True)
    )
    tree = tree.model_copy(update={"supervisors": [first, second]})

    lines = render(tree, source="/tmp/x.sock", width=80)

    assert sorted(line.split()[0] for line in lines[2:]) == ["abcdef01230", "abcdef01231"]


def test_without_a_terminal_top_prints_one_plain_frame_and_exits(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from controlplane.runtime._admin import AdminServer

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


@pytest.mark.parametrize(
    ("columns", "wide"), [(200, False), (80, False), (80, True)], ids=["200", "80", "80-wide"]
)
def test_top_in_a_terminal_shows_a_running_child_and_quits_on_q(
    served: tuple[SubagentControl, str], hold: threading.Event, columns: int, wide: bool
) -> None:
    control, path = served
    provider = FakeProvider()
    control.providers.register(provider)
    parent: AgentHandle = control.agents.register("parent-1")
    child_id, task_id, _plan = running_child(control, parent, provider, hold)
    # At 200 columns the row fits whole; at 80 its ids shrink to what `transcript` takes,
    # unless --wide (then the terminal wraps the row).
    whole = wide or columns == 200
    shown_child, shown_task = (child_id, task_id) if whole else (child_id[:8], task_id[:8])

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    argv = ["top", "--socket", path, "--interval", "0.1", *(["--wide"] if wide else [])]
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        close_fds=True,
    )
    os.close(slave)
    try:
        screen = _read_until(master, b"parent-1")
        os.write(master, b"q")
        assert proc.wait(timeout=10) == EXIT_OK
        screen += _drain(master)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)

    text = screen.decode("utf-8", "replace")
    row = next(line for line in text.splitlines() if shown_child in line)
    assert "running" in row
    assert "parent-1" in row
    assert shown_task in row
    if not whole:
        assert child_id not in text
        assert len(row.replace("\x1b[K", "")) <= columns
    assert text.index("\x1b[?1049h") < text.index(shown_child)  # drawn on the alternate screen
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


def test_the_live_views_show_each_child_s_label() -> None:
    tree = sample_tree()
    busy = tree.supervisors[1].model_copy(update={"label": "research otters"})
    tree = tree.model_copy(update={"supervisors": [tree.supervisors[0], busy]})

    (row,) = [line for line in render(tree, source="s") if line.startswith("child-busy")]
    assert row.endswith("parent-1  research otters")
    assert "label='research otters'" in tree.render()


def test_a_running_child_s_supervisor_reports_its_task_s_label(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> None:
    child_id, task_id, _plan = running_child(control, parent, provider, hold)
    label = control.tasks.get(task_id, requester=parent).label
    assert label

    (node,) = [s for s in control.dump_tree().supervisors if s.child_id == child_id]
    assert node.label == label
