"""SPEC §4/§5 lifecycle: close, the context manager, options, imports, a clean exit."""

from __future__ import annotations

import subprocess
import textwrap
import threading

import pykka
import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    SubagentControl,
    TaskSnapshot,
    TaskStatus,
)
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import WAIT_S, MakeControl, raises, run_python, start_child, text


def test_close_cancels_and_settles_every_activation_then_stops_the_actors(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
) -> None:
    settled: list[TaskSnapshot] = []
    control.tasks.on_done(settled.append)
    unpublished = provider.plan(start_gate=threading.Event())
    starting = start_child(control, parent)
    assert unpublished.entered.wait(WAIT_S)
    published = provider.plan(result_gate=threading.Event())
    running = start_child(control, stranger)
    assert control.send_message(stranger, running.child_id, text("hi")).route == "steered"

    control.close()

    assert control.closed
    assert {(s.id, s.status) for s in settled} == {
        (starting.task_id, TaskStatus.KILLED),
        (running.task_id, TaskStatus.KILLED),
    }
    assert unpublished.rolled_back.is_set()
    assert published.disposed.is_set()
    assert provider.total_live() == 0
    assert pykka.ActorRegistry.get_all() == []


def test_close_is_idempotent(control: SubagentControl, parent: AgentHandle) -> None:
    start_child(control, parent)

    control.close()
    control.close()

    assert control.closed
    assert pykka.ActorRegistry.get_all() == []


def test_the_control_plane_is_a_context_manager(sqlite_url: str, provider: FakeProvider) -> None:
    with SubagentControl.open(sqlite_url) as control:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        plan = provider.plan(result_gate=threading.Event())
        started = start_child(control, parent)
        assert plan.returned.wait(WAIT_S)
        assert not control.closed

    assert control.closed
    assert plan.disposed.is_set()
    assert pykka.ActorRegistry.get_all() == []
    assert started.child_id


def test_a_closed_control_plane_refuses_with_closed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    started = start_child(control, parent)
    control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    control.close()

    with raises(ErrorCode.CLOSED):
        start_child(control, parent)
    with raises(ErrorCode.CLOSED):
        control.send_message(parent, started.child_id, text("hello?"))
    assert provider.resumes == []
    assert len(provider.starts) == 1


def test_open_builds_the_store_from_the_url_and_passes_every_option(
    make_control: MakeControl, sqlite_url: str, provider: FakeProvider
) -> None:
    control = make_control(sqlite_url, task_tools=False)
    parent = control.agents.register("parent-1")

    assert isinstance(control.store, SqlStore)
    with raises(ErrorCode.NO_CONTROL_SURFACE):
        start_child(control, parent)

    with_tools = make_control(sqlite_url.replace("state.db", "other.db"), task_tools=True)
    other = with_tools.agents.register("parent-1")
    started = start_child(with_tools, other)
    with_tools.tasks.wait(started.task_id, timeout=WAIT_S, requester=other)


def run_with_a_control_plane(
    sqlite_url: str, scenario: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``scenario`` in a fresh interpreter that has ``control`` on ``sqlite_url``, its
    `FakeProvider` ``provider`` and a live ``parent``."""
    prelude = f"""
        import threading
        from controlplane import ContinuableStartSpec, SubagentControl, TextBlock
        from tests.fakes import FakeProvider

        provider = FakeProvider()
        control = SubagentControl.open({sqlite_url!r})
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        """
    return run_python("-c", textwrap.dedent(prelude) + textwrap.dedent(scenario), timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("package", ["persistence", "actors", "controlplane"])
def test_each_package_imports_alone_in_a_fresh_interpreter(package: str) -> None:
    done = run_python(
        "-c",
        textwrap.dedent(
            f"""
            import sys
            import {package}
            assert "controlplane.runtime._facade" not in sys.modules, "the facade was pulled in"
            print("ok")
            """
        ),
        timeout=30.0,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.slow
def test_the_process_exits_cleanly_after_close(sqlite_url: str) -> None:
    done = run_with_a_control_plane(
        sqlite_url,
        """
        running = provider.plan(result_gate=threading.Event())
        start = control.start_continuable(ContinuableStartSpec(
            provider="fake", label="bg", prompt=[TextBlock(text="go")], parent=parent))
        assert running.returned.wait(5)
        gated = provider.plan(start_gate=threading.Event())
        control.send_message(parent, start.child_id, [TextBlock(text="more")])
        other = control.start_continuable(ContinuableStartSpec(
            provider="fake", label="bg2", prompt=[TextBlock(text="go")], parent=parent))
        assert gated.entered.wait(5)
        control.close()
        print("closed")
        """,
        timeout=20.0,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"


def test_the_tree_names_supervisors_by_child_id_and_activations_by_task_id(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    provider.plan(result_gate=release)
    started = start_child(control, parent)
    assert control.send_message(parent, started.child_id, text("hi")).route == "steered"

    tree = control.dump_tree()

    (node,) = tree.supervisors
    assert node.child_id == started.child_id
    assert node.parent_session == parent.session_id
    assert node.activation is not None
    assert node.activation.task_id == started.task_id
    assert node.activation.published
    assert not tree.closed
    assert started.child_id in tree.render()
    release.set()
    control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)


@pytest.mark.slow
def test_the_process_exits_even_when_an_activation_never_quiesces(sqlite_url: str) -> None:
    done = run_with_a_control_plane(
        sqlite_url,
        """
        stuck = provider.plan(result_gate=threading.Event(), dispose_gate=threading.Event())
        control.start_continuable(ContinuableStartSpec(
            provider="fake", label="stuck", prompt=[TextBlock(text="go")], parent=parent))
        assert stuck.returned.wait(5)
        control.close(timeout_s=0.2)
        print("closed")
        """,
        timeout=15.0,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
