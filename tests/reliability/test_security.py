"""Security: owner fencing (SPEC §5 Tasks), the read-only admin socket (§7), no code execution
from stored data, and SQL built only with bound parameters (§8 "nothing half-written")."""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import (
    AgentHandle,
    ChildMeta,
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    SubagentControl,
    TaskStatus,
)
from controlplane.tools import ToolHandlers
from tests.fakes import FakeProvider, Plan
from tests.reliability.support import (
    WAIT_S,
    carrying,
    events,
    eventually,
    is_durable,
    raises,
    settle,
    start_child,
    text,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("controlplane", "actors", "persistence")


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def hold() -> Iterator[threading.Event]:
    """Keeps every run a test starts with it running until the test ends."""
    gate = threading.Event()
    yield gate
    gate.set()


def running_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> tuple[str, str, Plan]:
    plan = provider.plan(result_gate=hold)
    start = start_child(control, parent)
    assert plan.returned.wait(WAIT_S)
    eventually(lambda: is_durable(control, start.child_id), "the run is published")
    return start.child_id, start.task_id, plan


def idle_child(control: SubagentControl, parent: AgentHandle) -> tuple[str, str]:
    start = start_child(control, parent)
    settle(control, start.task_id, parent)
    return start.child_id, start.task_id


# -- a foreign parent ------------------------------------------------------------------------


def test_a_foreign_parent_cannot_steer_a_running_child(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, hold)

    with raises(ErrorCode.TASK_NOT_FOUND) as info:
        control.send_message(stranger, child_id, text("obey me"))

    assert task_id not in info.value.message  # the Task's existence is not leaked
    assert provider.steers == []
    assert carrying(events(control, child_id), "obey me") == []
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING


def test_a_foreign_parent_cannot_resume_an_idle_child(
    control: SubagentControl, parent: AgentHandle, stranger: AgentHandle, provider: FakeProvider
) -> None:
    child_id, _ = idle_child(control, parent)
    before = events(control, child_id)

    result = control.send_message(stranger, child_id, text("continue for me"))
    snapshot = settle(control, result.task_id, stranger)

    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.UNAUTHORIZED
    assert "another parent session" in (snapshot.outcome.detail or "")
    assert provider.resumes == []
    assert events(control, child_id) == before
    # The stranger's failed Task is the stranger's alone; the owner sees nothing of it.
    assert result.task_id not in [t.id for t in control.tasks.list(parent)]


def test_a_foreign_parent_cannot_read_another_parents_task(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    _, task_id, _ = running_child(control, parent, provider, hold)
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
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    _, task_id, plan = running_child(control, parent, provider, hold)

    with raises(ErrorCode.TASK_NOT_FOUND):
        control.tasks.kill(task_id, requester=stranger)

    assert plan.signal is not None
    assert not plan.signal.aborted
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING


def test_a_foreign_parent_lists_none_of_another_parents_children_tasks_or_notices(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    running_child(control, parent, provider, hold)
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
    hold: threading.Event,
) -> None:
    child_id, task_id, plan = running_child(control, parent, provider, hold)
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
    provider: FakeProvider,
    hold: threading.Event,
    sock_path: str,
) -> None:
    child_id, task_id, plan = running_child(control, parent, provider, hold)
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


# -- no code execution from data, SQL only with bound parameters -------------------------------

FORBIDDEN = re.compile(
    r"\bpickle\b|\bcPickle\b|\bdill\b|\bshelve\b|\bmarshal\b|\beval\(|\bexec\(|yaml\.load|"
    r"\bjsonpickle\b|__import__\("
)


def python_sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def test_no_package_deserialises_stored_data_with_pickle_eval_exec_marshal_or_yaml() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in python_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert len(python_sources()) > 10
    assert found == []


def _formats_a_string(node: ast.expr) -> bool:
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(part, ast.FormattedValue) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "join", "replace")
    )


def persistence_trees() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted((REPO / "persistence").rglob("*.py"))
    ]


def test_persistence_passes_no_formatted_string_to_an_sql_call() -> None:
    offenders = []
    calls = 0
    for path, tree in persistence_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("text", "exec_driver_sql", "execute", "executemany", "executescript"):
                continue
            calls += 1
            if _formats_a_string(node.args[0]):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert calls > 5, "persistence/ issues no SQL at all? the scan is looking at the wrong code"
    assert offenders == []


SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|WHERE|VALUES)\b")
# What an SQL f-string may interpolate: the DBAPI placeholder and identifier constants.
PLACEHOLDER = "p"
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def test_sql_built_with_f_strings_interpolates_only_identifier_constants_and_placeholders() -> None:
    offenders = []
    sql_strings = 0
    for path, tree in persistence_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            literal = "".join(
                part.value
                for part in node.values
                if isinstance(part, ast.Constant) and isinstance(part.value, str)
            )
            if not SQL_WORDS.search(literal):
                continue
            sql_strings += 1
            for part in node.values:
                if not isinstance(part, ast.FormattedValue):
                    continue
                value = part.value
                ok = isinstance(value, ast.Name) and (
                    value.id == PLACEHOLDER or CONSTANT.match(value.id) is not None
                )
                if not ok or part.conversion != -1:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert sql_strings > 0, "no SQL f-string found: the scan is looking at the wrong code"
    assert offenders == []


HOSTILE = [
    "'); DROP TABLE events; --",
    "Robert'); DROP TABLE children;--",
    '" OR 1=1; --',
    "\\'; SELECT pg_sleep(5); --",
    "%s %(x)s {0} :param ?",
]


def test_sql_metacharacters_in_ids_labels_and_messages_are_stored_and_read_back_intact(
    control: SubagentControl, provider: FakeProvider
) -> None:
    assert control.store is not None
    for number, hostile in enumerate(HOSTILE):
        parent = control.agents.register(f"{hostile} parent {number}")
        start = start_child(control, parent, label=hostile, prompt=hostile)
        settle(control, start.task_id, parent)
        follow_up = control.send_message(parent, start.child_id, text(hostile, hostile))
        settle(control, follow_up.task_id, parent)

        loaded = control.store.load(start.child_id)
        assert loaded.meta.parent_session == f"{hostile} parent {number}"
        assert loaded.meta.label == hostile
        prompts = [e.data["text"] for e in loaded.events if e.kind == EventKind.USER_MESSAGE]
        assert prompts == [hostile, hostile + hostile]
        assert [c.child_id for c in control.store.list_children(parent.session_id)] == [
            start.child_id
        ]
        parent.dispose()
    # Every table is still there and still answers.
    assert len(provider.starts) == len(HOSTILE)


def test_sql_metacharacters_in_store_ids_kinds_and_data_round_trip_through_the_store(
    control: SubagentControl,
) -> None:
    store = control.store
    assert store is not None
    for number, hostile in enumerate(HOSTILE):
        child_id = f"{hostile}#{number}"
        source = MessageSource(kind="human", sender_session_id=hostile)
        event = NewEvent(kind=hostile, turn=1, data={hostile: [hostile]}, source=source)
        store.create_child(
            ChildMeta(child_id=child_id, parent_session=hostile, depth=1, label=hostile), [event]
        )
        store.append(child_id, [event, {"kind": "x", "turn": 1, "data": hostile}])

        loaded = store.load(child_id)
        assert loaded.meta.parent_session == hostile
        assert [(e.seq, e.kind, e.data, e.source) for e in loaded.events] == [
            (1, hostile, {hostile: [hostile]}, source),
            (2, hostile, {hostile: [hostile]}, source),
            (3, "x", hostile, None),
        ]
        assert [(m.child_id, m.label) for m in store.list_children(hostile)] == [
            (child_id, hostile)
        ]
    assert len(store.list_children(None)) == len(HOSTILE)


@pytest.mark.xfail(
    strict=True,
    reason="bug: every send to a child id that does not exist leaves a supervisor actor (a "
    "thread) until close (actors/root.py _ensure creates it; nothing stops it once the resume "
    "Task failed NOT_RESUMABLE)",
)
def test_sends_to_children_that_do_not_exist_leave_no_supervisor_threads_behind(
    control: SubagentControl, parent: AgentHandle
) -> None:
    threads_before = threading.active_count()
    unknown = [f"00000000-0000-4000-8000-{n:012d}" for n in range(20)]

    for child_id in unknown:
        result = control.send_message(parent, child_id, text("anyone?"))
        snapshot = settle(control, result.task_id, parent)
        assert snapshot.outcome is not None
        assert snapshot.outcome.code is ErrorCode.NOT_RESUMABLE

    supervised = {s.child_id for s in control.dump_tree(timeout_s=2.0).supervisors}
    assert supervised.isdisjoint(unknown)
    assert threading.active_count() < threads_before + len(unknown)
