"""The offline Task and runtime views: ``subagent-control tasks`` and ``runtimes``."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from controlplane import ContinuableStartSpec, SubagentControl
from controlplane.cli import main
from controlplane.contract import utcnow
from persistence._schema import sqlite_time
from tests.fakes import FakeProvider
from tests.support import idle_child, text, wait_published


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().out


def test_tasks_and_runtimes_are_listed_from_the_store_after_the_runtime_closed(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SubagentControl.open(store_url) as control:
        control.providers.register(FakeProvider())
        mine = control.agents.register("parent-1")
        theirs = control.agents.register("parent-2")
        idle_child(control, mine)
        idle_child(control, theirs)
        runtime_id = control.runtime_id

    status, out = run(capsys, "tasks", "--db", store_url, "--owner", "parent-1", "--json")
    assert status == 0
    (task,) = [json.loads(line) for line in out.splitlines()]
    assert task["owner_session"] == "parent-1"
    assert task["status"] == "completed"
    assert task["runtime_id"] == runtime_id

    status, out = run(capsys, "tasks", "--db", store_url)
    assert status == 0
    assert out.splitlines()[0].split() == [
        "TASK", "STATUS", "OWNER", "CHILD", "CREATED", "RUNTIME", "TOKENS", "CALLS", "COST",
        "LABEL",
    ]  # fmt: skip
    assert len(out.splitlines()) == 3

    status, out = run(capsys, "runtimes", "--db", store_url, "--json")
    assert status == 0
    (runtime,) = [json.loads(line) for line in out.splitlines()]
    assert runtime["runtime_id"] == runtime_id
    assert runtime["alive"] is False  # closed
    assert runtime["running_tasks"] == 0
    assert runtime["closed_at"] is not None
    assert runtime["claims"] == []  # each turn's end released its claim


def test_runtimes_show_which_runtime_holds_which_child_and_its_fence(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = threading.Event()
    provider = FakeProvider()
    with SubagentControl.open(sqlite_url) as control:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        child = idle_child(control, parent)
        provider.plan(result_gate=gate)
        sent = control.send_message(parent, child, text("again"))
        wait_published(control, child)
        status, out = run(capsys, "runtimes", "--db", sqlite_url, "--json")
        assert status == 0
        (runtime,) = [json.loads(line) for line in out.splitlines()]
        assert runtime["runtime_id"] == control.runtime_id
        assert runtime["claims"] == [{"child_id": child, "task_id": sent.task_id, "fence": 2}]
        status, out = run(capsys, "runtimes", "--db", sqlite_url)
        assert f"{child}@2" in out
        (node,) = control.dump_tree(timeout_s=1.0).supervisors
        assert node.activation is not None
        assert node.activation.fence == 2
        gate.set()


def test_an_empty_store_says_so(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with SubagentControl.open(sqlite_url):
        pass
    assert run(capsys, "tasks", "--db", sqlite_url, "--owner", "nobody") == (
        0,
        "(no tasks of session nobody)\n",
    )
    status, out = run(capsys, "runtimes", "--db", sqlite_url)
    assert status == 0
    assert "dead" in out.splitlines()[1]


def test_runtimes_judge_a_sqlite_lease_on_the_boot_clock_not_the_wall_clock(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from persistence import RetryPolicy, SqlStore, boot_id, host_name

    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        store.ledger.register_runtime(
            "skewed", host=host_name(), pid=1, boot_id=boot_id(), lease_ttl_s=10.0
        )
        # Renewed just now by a process whose wall clock runs two minutes behind.
        with store._db.connection(write=True) as conn:
            conn.execute(
                sa.text("UPDATE subagent_runtimes SET heartbeat_at = :at"),
                {"at": sqlite_time(utcnow() - timedelta(seconds=120))},
            )
    status, out = run(capsys, "runtimes", "--db", sqlite_url, "--json")
    assert status == 0
    (runtime,) = [json.loads(line) for line in out.splitlines()]
    assert runtime["alive"] is (boot_id() is not None)  # no boot clock: the wall's verdict


def test_the_tasks_view_shows_a_queued_tasks_place(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = threading.Event()
    provider = FakeProvider()
    provider.default_plan(result_gate=gate)
    with SubagentControl.open(store_url, concurrency={"fake": 1}) as control:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        spec = ContinuableStartSpec(provider="fake", label="job", prompt=text("go"), parent=parent)
        holder = control.start_continuable(spec)
        queued = control.start_continuable(spec)

        status, out = run(capsys, "tasks", "--db", store_url)
        rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
        status_json, out_json = run(capsys, "tasks", "--db", store_url, "--json")
        gate.set()
        control.tasks.wait(queued.task_id, timeout=10.0, requester=parent)

    assert (status, status_json) == (0, 0)
    assert rows[holder.task_id][1] == "running"
    assert rows[queued.task_id][1:3] == ["queued", "#1"]
    listed = {t["id"]: t for t in map(json.loads, out_json.splitlines())}
    assert listed[queued.task_id]["queue_position"] == 1
    assert listed[queued.task_id]["queued_at"] is not None
