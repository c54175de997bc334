"""SPEC §5 Tasks, agents, providers: fencing, listing, listeners, notices, the registry."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    SubagentControl,
    SubagentResult,
    TaskSnapshot,
    TaskStatus,
)
from controlplane.contract import ClaimConflict, SubagentControlError
from tests.fakes import FakeProvider, completed
from tests.support import WAIT_S, raises, settle, start_child, task_ids

FENCED: dict[str, Callable[[SubagentControl, str, AgentHandle], object]] = {
    "get": lambda c, t, r: c.tasks.get(t, requester=r),
    "wait": lambda c, t, r: c.tasks.wait(t, timeout=1.0, requester=r),
    "kill": lambda c, t, r: c.tasks.kill(t, requester=r),
    "output": lambda c, t, r: c.tasks.output(t, requester=r),
}


@pytest.mark.parametrize("operation", sorted(FENCED))
def test_another_owner_cannot_see_a_task(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    operation: str,
) -> None:
    release = threading.Event()
    provider.plan(result_gate=release)
    started = start_child(control, parent)

    with raises(ErrorCode.TASK_NOT_FOUND):
        FENCED[operation](control, started.task_id, stranger)
    with raises(ErrorCode.TASK_NOT_FOUND):
        FENCED[operation](control, started.task_id, stranger.session_id)  # type: ignore[arg-type]

    assert control.tasks.get(started.task_id, requester=parent).status is TaskStatus.RUNNING
    release.set()
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED


@pytest.mark.parametrize("operation", sorted(FENCED))
def test_an_unknown_task_id_is_task_not_found(
    control: SubagentControl, parent: AgentHandle, operation: str
) -> None:
    with raises(ErrorCode.TASK_NOT_FOUND):
        FENCED[operation](control, "no-such-task", parent)


def test_the_owner_may_name_itself_by_session_id(
    control: SubagentControl, parent: AgentHandle
) -> None:
    started = start_child(control, parent)

    snapshot = control.tasks.wait(started.task_id, timeout=WAIT_S, requester="parent-1")

    assert snapshot.status is TaskStatus.COMPLETED
    assert control.tasks.get(started.task_id, requester=parent) == snapshot


def test_tasks_list_shows_the_requesters_tasks_oldest_first(
    control: SubagentControl, parent: AgentHandle, stranger: AgentHandle
) -> None:
    mine = [start_child(control, parent, label=f"job {i}").task_id for i in range(5)]
    theirs = start_child(control, stranger).task_id

    listed = control.tasks.list(parent)

    assert [snapshot.id for snapshot in listed] == mine
    assert [snapshot.label for snapshot in listed] == [f"job {i}" for i in range(5)]
    assert task_ids(control, stranger) == [theirs]
    assert [s.created_at for s in listed] == sorted(s.created_at for s in listed)
    for task_id in mine:
        settle(control, task_id, parent)
    settle(control, theirs, stranger)


def test_on_done_listeners_get_the_terminal_snapshot_until_unsubscribed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    seen: list[TaskSnapshot] = []
    unsubscribe = control.tasks.on_done(seen.append)
    provider.plan(result=completed("the answer"))

    first = start_child(control, parent, label="first")
    final = settle(control, first.task_id, parent)
    unsubscribe()
    second = start_child(control, parent, label="second")
    settle(control, second.task_id, parent)

    assert seen == [final]
    (snapshot,) = seen
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "the answer"
    assert snapshot.label == "first"


def test_a_failing_on_done_listener_does_not_stop_the_others(
    control: SubagentControl, parent: AgentHandle
) -> None:
    seen: list[str] = []

    def broken(snapshot: TaskSnapshot) -> None:
        raise RuntimeError("listener bug")

    control.tasks.on_done(broken)
    control.tasks.on_done(lambda snapshot: seen.append(snapshot.id))
    started = start_child(control, parent)

    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    assert seen == [started.task_id]


def test_completion_notices_are_drained_per_owner(
    control: SubagentControl, parent: AgentHandle, stranger: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(result=completed("all good"))
    provider.plan(result=SubagentResult(stop_reason="refusal"))
    provider.plan(result_gate=threading.Event())
    ok = start_child(control, parent, label="ok job")
    settle(control, ok.task_id, parent)
    refused = start_child(control, parent, label="refused job")
    settle(control, refused.task_id, parent)
    killed = start_child(control, stranger, label="killed job")
    control.tasks.kill(killed.task_id, requester=stranger)
    settle(control, killed.task_id, stranger)

    mine = control.tasks.drain_notices(parent)
    theirs = control.tasks.drain_notices(stranger)

    assert [(n.task_id, n.child_id, n.label, n.status) for n in mine] == [
        (ok.task_id, ok.child_id, "ok job", TaskStatus.COMPLETED),
        (refused.task_id, refused.child_id, "refused job", TaskStatus.FAILED),
    ]
    assert mine[0].summary == f"subagent task {ok.task_id} (ok job) finished: all good"
    assert mine[1].summary == f"subagent task {refused.task_id} (refused job) failed: refusal"
    (notice,) = theirs
    assert notice.status is TaskStatus.KILLED
    assert notice.summary.startswith(f"subagent task {killed.task_id} (killed job) stopped: ")
    assert all("\n" not in n.summary for n in [*mine, *theirs])
    assert control.tasks.drain_notices(parent) == []
    assert control.tasks.drain_notices(stranger) == []


def test_a_second_live_registration_of_an_agent_id_is_an_ownership_conflict(
    control: SubagentControl,
) -> None:
    first = control.agents.register("agent-a")

    with raises(ErrorCode.OWNERSHIP_CONFLICT):
        control.agents.register("agent-a")
    assert control.agents.get("agent-a") is first

    first.dispose()
    again = control.agents.register("agent-a", depth=2)
    assert again is not first
    assert control.agents.get("agent-a") is again


def test_agents_get_returns_the_live_handle_or_none(control: SubagentControl) -> None:
    handle = control.agents.register("agent-b")

    assert control.agents.get("agent-b") is handle
    assert control.agents.get("nobody") is None
    handle.dispose()
    assert control.agents.get("agent-b") is None


def test_error_code_values_equal_their_names() -> None:
    assert ErrorCode.NOT_DELIVERED == "NOT_DELIVERED"
    for code in ErrorCode:
        assert code.value == code.name
        assert code == code.name
    spec_codes = {
        "UNKNOWN_PROVIDER",
        "PERSISTENCE_UNAVAILABLE",
        "INVALID_DESCRIPTOR",
        "NO_CONTROL_SURFACE",
        "UNAUTHORIZED",
        "OWNERSHIP_CONFLICT",
        "NOT_DELIVERED",
        "NOT_RESUMABLE",
        "TASK_NOT_FOUND",
        "CANCELLED",
        "DURABILITY_FAILED",
        "INVALID_INPUT",
        "STORE_UNAVAILABLE",
        "CLOSED",
    }
    assert spec_codes <= {code.value for code in ErrorCode}


def test_task_status_values_are_the_spec_strings() -> None:
    assert [status.value for status in TaskStatus] == [
        "running",
        "completed",
        "failed",
        "killed",
        "interrupted",
        "queued",
        "input_required",
    ]
    live = {TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.INPUT_REQUIRED}
    assert {status for status in TaskStatus if not status.is_terminal} == live


def test_a_provider_is_registered_under_its_name(
    control: SubagentControl, parent: AgentHandle
) -> None:
    other = FakeProvider(name="other")
    control.providers.register(other)

    started = start_child(control, parent, provider="other")
    settle(control, started.task_id, parent)

    assert control.providers.get("other") is other
    assert "other" in control.providers.names()
    assert [request.child_id for request in other.starts] == [started.child_id]
    with raises(ErrorCode.UNKNOWN_PROVIDER):
        control.providers.get("nobody")


def test_output_is_empty_while_running_and_the_detail_once_failed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    provider.plan(result_gate=release, result=RuntimeError("went wrong"))
    started = start_child(control, parent)

    assert control.tasks.output(started.task_id, requester=parent) == ""
    release.set()
    settle(control, started.task_id, parent)
    assert control.tasks.output(started.task_id, requester=parent) == "went wrong"


def test_children_lists_a_starting_child_until_its_start_fails_before_publication(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    # A child is listed from its running initial Task until the store has it; a start that
    # fails before publication leaves no child, so once its Task settles it is not listed.
    release = threading.Event()
    provider.plan(start_gate=release, fail_start=RuntimeError("no model"))
    doomed = start_child(control, parent, label="doomed")

    assert [(v.child_id, v.label, v.running) for v in control.children(parent)] == [
        (doomed.child_id, "doomed", True)
    ]
    release.set()
    assert settle(control, doomed.task_id, parent).status is TaskStatus.FAILED
    assert control.children(parent) == []


def test_children_lists_every_child_of_the_parent_oldest_first(
    control: SubagentControl, parent: AgentHandle, stranger: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    first = start_child(control, parent, label="first")
    settle(control, first.task_id, parent)
    theirs = start_child(control, stranger, label="not mine")
    settle(control, theirs.task_id, stranger)
    # Plans go to activations in the order they call the provider: only `second` is left.
    provider.plan(start_gate=release)
    second = start_child(control, parent, label="second")

    views = control.children(parent)

    assert [(v.child_id, v.label, v.running) for v in views] == [
        (first.child_id, "first", False),
        (second.child_id, "second", True),
    ]
    assert [v.task_id for v in views] == [first.task_id, second.task_id]
    release.set()
    settle(control, second.task_id, parent)


def test_a_claim_conflict_is_an_ownership_conflict_that_names_its_runtime_and_pickles() -> None:
    # Only the sender's forwarding tells it apart (controlplane.runtime._facade); a caller sees an
    # ordinary OWNERSHIP_CONFLICT, also after crossing a process boundary.
    conflict = ClaimConflict("held elsewhere", child_id="c-1", runtime_id="rt-2")
    assert isinstance(conflict, SubagentControlError)
    assert (conflict.code, conflict.child_id, conflict.task_id) == (
        ErrorCode.OWNERSHIP_CONFLICT, "c-1", None,
    )  # fmt: skip
    back = pickle.loads(pickle.dumps(conflict))
    assert isinstance(back, ClaimConflict)
    assert (back.code, back.message, back.child_id, back.runtime_id) == (
        ErrorCode.OWNERSHIP_CONFLICT, "held elsewhere", "c-1", "rt-2",
    )  # fmt: skip
