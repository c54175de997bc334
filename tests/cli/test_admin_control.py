"""The admin socket and the CLI on a real `SubagentControl`, in-process and in a real process."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controlplane import (
    ActorTree,
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    ModelSelector,
    SubagentControl,
    TextBlock,
)
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_OK, EXIT_UNREACHABLE
from tests.cli.cli_support import start_ready_process, stop_process
from tests.fakes import FakeProvider, Plan
from tests.support import wait_published


@pytest.fixture
def control(sqlite_url: str) -> Iterator[SubagentControl]:
    control = SubagentControl.open(sqlite_url)
    try:
        yield control
    finally:
        control.close()


@pytest.fixture
def provider(control: SubagentControl) -> FakeProvider:
    fake = FakeProvider()
    control.providers.register(fake)
    return fake


@pytest.fixture
def parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("parent-1", model=ModelSelector(provider="acme", model="m1"))


def start(control: SubagentControl, parent: AgentHandle, label: str) -> ContinuableStart:
    spec = ContinuableStartSpec(
        provider="fake", label=label, prompt=[TextBlock(text=label)], parent=parent
    )
    return control.start_continuable(spec)


def cli_tree(capsys: pytest.CaptureFixture[str], path: str) -> ActorTree:
    status = main(["tree", "--socket", path, "--json"])
    out, err = capsys.readouterr()
    assert (status, err) == (EXIT_OK, "")
    return ActorTree.model_validate_json(out)


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``check``: the tree shows what the actors did, which happens on their threads."""
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if check():
            return True
        pause.wait(0.01)
    return False


def test_serve_admin_creates_a_0600_socket_that_close_removes(
    control: SubagentControl, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(sock_dir / "admin.sock")
    control.serve_admin(path)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert cli_tree(capsys, path).supervisors == []
    control.close()
    assert not os.path.exists(path)
    assert main(["tree", "--socket", path]) == EXIT_UNREACHABLE


def test_cli_tree_shows_idle_starting_running_and_settling_children(
    control: SubagentControl,
    provider: FakeProvider,
    parent: AgentHandle,
    sock_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(sock_dir / "admin.sock")
    control.serve_admin(path)
    start_gate, result_gate, dispose_gate = threading.Event(), threading.Event(), threading.Event()
    try:
        idle = start(control, parent, "idle one").child_id
        assert eventually(lambda: provider.disposes == [idle])
        starting_plan: Plan = provider.plan(start_gate=start_gate)
        starting = start(control, parent, "starting one").child_id
        assert starting_plan.entered.wait(10)
        running_plan: Plan = provider.plan(result_gate=result_gate)
        running = start(control, parent, "running one").child_id
        # Taken before the next start: plans go to calls in the order the calls come.
        assert running_plan.entered.wait(10)
        # Killed, with its disposal held: the turn is over but the activation is not gone.
        settling_plan: Plan = provider.plan(result_gate=result_gate, dispose_gate=dispose_gate)
        killed = start(control, parent, "settling one")
        settling = killed.child_id
        assert settling_plan.returned.wait(10)
        wait_published(control, settling)  # a kill before it would skip result()
        control.tasks.kill(killed.task_id, requester=parent)
        assert settling_plan.settled.wait(10)

        expected = {idle: "idle", starting: "starting", running: "running", settling: "settling"}

        def states() -> dict[str, str]:
            return {s.child_id: s.state for s in cli_tree(capsys, path).supervisors}

        assert eventually(lambda: states() == expected), states()
        tree = cli_tree(capsys, path)
        by_child = {s.child_id: s for s in tree.supervisors}
        assert by_child[idle].activation is None
        unpublished, published = by_child[starting].activation, by_child[running].activation
        assert unpublished is not None
        assert unpublished.published is False
        assert published is not None
        assert (published.published, published.kind) == (True, "initial")
        assert {s.parent_session for s in tree.supervisors} == {"parent-1"}

        assert main(["tree", "--socket", path]) == EXIT_OK
        text = capsys.readouterr().out
        assert f"supervisor {running} [running]" in text
        assert f"supervisor {idle} [idle]" in text
    finally:
        for gate in (start_gate, result_gate, dispose_gate):
            gate.set()


def test_cli_tree_children_and_transcript_read_the_demo_process_started_by_the_test(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/demo.db"
    path = str(sock_dir / "demo.sock")
    proc = start_ready_process(["examples/admin_demo.py", "--db", db, "--socket", path])
    try:
        tree = cli_tree(capsys, path)
        states = sorted(s.state for s in tree.supervisors)
        assert states == ["idle", "running"]
        idle = next(s.child_id for s in tree.supervisors if s.state == "idle")

        assert main(["children", "--db", db]) == EXIT_OK
        listed = capsys.readouterr().out
        assert {s.child_id for s in tree.supervisors} <= set(listed.split())

        assert main(["transcript", idle, "--db", db]) == EXIT_OK
        transcript = capsys.readouterr().out
        assert "assistant/message" in transcript
        assert "done: summary ready" in transcript
    finally:
        assert stop_process(proc) == 0
    assert not os.path.exists(path)
