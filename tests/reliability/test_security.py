"""Security: owner fencing (SPEC §5 Tasks: a foreign parent reaches nothing of another's), the
read-only admin socket (§7), and no thread left behind by sends to children that do not exist.
Stored-data safety (no pickle/eval, bound SQL) is in test_stored_data_safety.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    SubagentControl,
    TaskStatus,
)
from controlplane.tools import ToolHandlers
from tests.fakes import FakeProvider
from tests.support import (
    WAIT_S,
    Running,
    events,
    failed_outcome,
    idle_child,
    mentioning,
    raises,
    running_child,
    settle,
    text,
)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def running(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> Running:
    """A child of ``parent`` whose run is published and runs until the test ends."""
    return running_child(control, parent, provider, hold)


# -- a foreign parent ------------------------------------------------------------------------


def test_a_foreign_parent_cannot_steer_a_running_child(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    running: Running,
) -> None:
    child_id, task_id, _ = running

    with raises(ErrorCode.TASK_NOT_FOUND) as info:
        control.send_message(stranger, child_id, text("obey me"))

    assert task_id not in info.value.message  # the Task's existence is not leaked
    assert provider.steers == []
    assert mentioning(events(control, child_id), "obey me") == []
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING


def test_a_foreign_parent_cannot_resume_an_idle_child(
    control: SubagentControl, parent: AgentHandle, stranger: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    before = events(control, child_id)

    result = control.send_message(stranger, child_id, text("continue for me"))
    snapshot = settle(control, result.task_id, stranger)

    outcome = failed_outcome(snapshot)
    assert outcome.code is ErrorCode.UNAUTHORIZED
    assert "another parent session" in (outcome.detail or "")
    assert provider.resumes == []
    assert events(control, child_id) == before
    # The stranger's failed Task is the stranger's alone; the owner sees nothing of it.
    assert result.task_id not in [t.id for t in control.tasks.list(parent)]


def test_a_foreign_parent_cannot_read_another_parents_task(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    running: Running,
) -> None:
    _, task_id, _ = running
    unknown = "00000000-0000-4000-8000-000000000000"

    for read in (control.tasks.get, control.tasks.output):
        with raises(ErrorCode.TASK_NOT_FOUND) as foreign:
            read(task_id, requester=stranger)
        with raises(ErrorCode.TASK_NOT_FOUND) as missing:
            read(unknown, requester=stranger)
        # Indistinguishable from an id that does not exist.
        assert foreign.value.message.replace(task_id, unknown) == missing.value.message
    with raises(ErrorCode.TASK_NOT_FOUND):
        control.tasks.wait(task_id, timeout=0.01, requester=stranger)
    with raises(ErrorCode.TASK_NOT_FOUND):
        control.tasks.get(task_id, requester=stranger.session_id)


def test_a_foreign_parent_cannot_kill_another_parents_task(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    running: Running,
) -> None:
    _, task_id, plan = running

    with raises(ErrorCode.TASK_NOT_FOUND):
        control.tasks.kill(task_id, requester=stranger)

    assert plan.signal is not None
    assert not plan.signal.aborted
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING


def test_a_foreign_parent_lists_none_of_another_parents_children_tasks_or_notices(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    running: Running,
) -> None:
    idle_child(control, parent)

    assert control.tasks.list(stranger) == []
    assert control.children(stranger) == []
    assert control.tasks.drain_notices(stranger) == []
    assert control.store is not None
    assert control.store.list_children(stranger.session_id) == []
    assert len(control.children(parent)) == 2


def test_a_foreign_parents_tools_cannot_reach_another_parents_child_or_task(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    running: Running,
) -> None:
    child_id, task_id, plan = running
    tools = ToolHandlers(control, stranger, provider="fake")
    before = events(control, child_id)

    calls = {
        "send_message": {"subagent_id": child_id, "message": "obey"},
        "task_output": {"task_id": task_id},
        "task_kill": {"task_id": task_id},
    }
    for name, arguments in calls.items():
        result = tools.call(name, arguments)
        assert result.is_error, (name, result)
        assert result.text.startswith("error ["), result
    assert tools.call("task_list", {}).text == "(no tasks)"
    assert tools.call("list_agents", {}).text == "(no subagents)"
    assert events(control, child_id) == before
    assert plan.signal is not None
    assert not plan.signal.aborted
    assert provider.steers == []


# -- the admin socket ------------------------------------------------------------------------


@pytest.fixture
def sock_path() -> Iterator[str]:
    # sun_path holds 107 bytes: tmp_path is often longer.
    directory = tempfile.mkdtemp(prefix="sc-rel-", dir="/tmp")
    try:
        yield os.path.join(directory, "admin.sock")
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def exchange(path: str, payload: bytes) -> list[dict[str, object]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(WAIT_S)
        client.connect(path)
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := client.recv(65536):
            raw += chunk
    return [json.loads(line) for line in raw.splitlines()]


def test_the_admin_socket_is_0600_and_serves_only_the_read_only_tree(
    control: SubagentControl,
    parent: AgentHandle,
    running: Running,
    sock_path: str,
) -> None:
    child_id, task_id, plan = running
    control.serve_admin(sock_path)
    before = events(control, child_id)

    mode = os.lstat(sock_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    hostile = [
        {"op": "kill", "task_id": task_id},
        {"op": "send_message", "child_id": child_id, "message": "x"},
        {"op": "close"},
        {"op": "tree", "then": "kill"},
        {"op": "__import__('os').system('true')"},
    ]
    payload = b"".join(json.dumps(r).encode() + b"\n" for r in hostile) + b'{"op":"tree"}\n'
    replies = exchange(sock_path, payload)

    assert replies[-1]["ok"] is True
    tree = replies[-1]["tree"]
    assert isinstance(tree, dict)
    assert child_id in json.dumps(tree)
    assert all(reply["ok"] is False for reply in replies[:2])
    assert plan.signal is not None
    assert not plan.signal.aborted
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING
    assert events(control, child_id) == before
    assert not control.closed

    control.close()
    assert not os.path.exists(sock_path)


def test_sends_to_children_that_do_not_exist_leave_no_supervisor_threads_behind(
    control: SubagentControl, parent: AgentHandle
) -> None:
    threads_before = threading.active_count()
    unknown = [f"00000000-0000-4000-8000-{n:012d}" for n in range(20)]

    for child_id in unknown:
        with raises(ErrorCode.CHILD_NOT_FOUND):
            control.send_message(parent, child_id, text("anyone?"))

    supervised = {s.child_id for s in control.dump_tree(timeout_s=2.0).supervisors}
    assert supervised.isdisjoint(unknown)
    assert threading.active_count() < threads_before + len(unknown)
