"""SPEC §5 outcomes and settlement when the provider misbehaves: every fault becomes an
honest Task outcome, nothing half-durable is left, and the other children keep working."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    SubagentControl,
    TaskSnapshot,
    TaskStatus,
)
from tests.fakes import FakeProvider
from tests.support import (
    WAIT_S,
    events,
    failed_outcome,
    is_durable,
    kinds,
    raises,
    settle,
    start_child,
    starting_child,
    text,
)

FRAME = [EventKind.TURN_START, EventKind.USER_MESSAGE, EventKind.DESCRIPTOR]


class ProviderAbort(BaseException):
    """What a hostile provider might raise: not an `Exception`."""


def test_a_provider_failing_before_publication_fails_the_task_with_its_text_and_no_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    plan = provider.plan(fail_start=RuntimeError("the model endpoint refused the API key"))

    start = start_child(control, parent)
    snapshot = settle(control, start.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert "the model endpoint refused the API key" in (outcome.detail or "")
    assert plan.rolled_back.is_set()
    assert not is_durable(control, start.child_id)
    assert control.store is not None
    assert control.store.list_children(parent.session_id) == []
    # Nothing resumable was left: a follow-up is refused at once, and starts nothing.
    with raises(ErrorCode.CHILD_NOT_FOUND):
        control.send_message(parent, start.child_id, text("anyone there?"))
    assert [task.id for task in control.tasks.list(parent)] == [start.task_id]
    assert provider.resumes == []


def test_a_run_whose_result_raises_fails_the_task_and_leaves_a_resumable_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(result=RuntimeError("the tool sandbox crashed"))

    start = start_child(control, parent)
    snapshot = settle(control, start.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert outcome.detail == "the tool sandbox crashed"
    stored = events(control, start.child_id)
    assert kinds(stored) == [*FRAME, EventKind.TURN_END]
    assert stored[-1].data["status"] == "failed"
    again = control.send_message(parent, start.child_id, text("try again"))
    assert again.route == "started"
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED


def test_a_failing_dispose_fails_the_task_naming_the_earlier_outcome_and_the_dispose_error(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(fail_dispose=RuntimeError("the sandbox would not stop"))

    start = start_child(control, parent)
    snapshot = settle(control, start.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert outcome.detail == "completed; dispose failed: the sandbox would not stop"
    assert events(control, start.child_id)[-1].data["status"] == "failed"


def test_a_raising_result_and_a_failing_dispose_report_both_causes(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(result=RuntimeError("boom"), fail_dispose=RuntimeError("stuck"))

    start = start_child(control, parent)
    snapshot = settle(control, start.task_id, parent)

    assert snapshot.outcome is not None
    assert snapshot.outcome.detail == "boom; dispose failed: stuck"


def test_a_run_hanging_until_cancelled_is_recorded_killed_only_after_its_dispose(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    never = threading.Event()
    plan = provider.plan(result_gate=never)
    disposed_at_settlement: list[bool] = []

    def on_done(snapshot: TaskSnapshot) -> None:
        disposed_at_settlement.append(plan.disposed.is_set())

    control.tasks.on_done(on_done)
    start = start_child(control, parent)
    assert plan.returned.wait(WAIT_S)
    assert control.tasks.get(start.task_id, requester=parent).status is TaskStatus.RUNNING

    control.tasks.kill(start.task_id, requester=parent)
    snapshot = settle(control, start.task_id, parent)

    assert snapshot.status is TaskStatus.KILLED
    assert disposed_at_settlement == [True]
    assert provider.live(start.child_id) == 0
    assert events(control, start.child_id)[-1].data["status"] == "killed"


def test_a_start_hanging_until_cancelled_rolls_back_and_leaves_no_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    start, plan = starting_child(control, parent, provider)
    control.tasks.kill(start.task_id, requester=parent)
    snapshot = settle(control, start.task_id, parent)

    assert snapshot.status is TaskStatus.KILLED
    assert plan.rolled_back.is_set()
    assert provider.live(start.child_id) == 0
    assert not is_durable(control, start.child_id)


def test_a_hanging_dispose_keeps_the_task_running_until_the_dispose_returns(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    plan = provider.plan(dispose_gate=release)

    start = start_child(control, parent)
    assert plan.settled.wait(WAIT_S)
    with raises(ErrorCode.TIMEOUT):
        control.tasks.wait(start.task_id, timeout=0.05, requester=parent)
    assert control.tasks.get(start.task_id, requester=parent).status is TaskStatus.RUNNING

    release.set()
    assert settle(control, start.task_id, parent).status is TaskStatus.COMPLETED


def test_one_faulty_child_does_not_disturb_the_others(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(fail_start=RuntimeError("broken"))
    provider.plan(result=RuntimeError("crashed"))
    provider.plan(fail_dispose=RuntimeError("leaked"))

    # Plans go to activations in the order they call the provider: let the three faulty
    # ones take theirs before the healthy child starts.
    faulty = [start_child(control, parent, label=f"faulty {n}") for n in range(3)]
    assert all(settle(control, s.task_id, parent).status is TaskStatus.FAILED for s in faulty)
    healthy = start_child(control, parent, label="healthy")

    assert settle(control, healthy.task_id, parent).status is TaskStatus.COMPLETED
    again = control.send_message(parent, healthy.child_id, text("more"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED


@pytest.mark.parametrize("where", ["fail_start", "result", "fail_dispose"])
def test_a_provider_raising_a_base_exception_fails_its_task_and_spares_the_other_children(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, where: str
) -> None:
    # Escaping an actor, a BaseException would make pykka stop every actor in the process.
    healthy = start_child(control, parent, label="healthy")
    settle(control, healthy.task_id, parent)
    provider.plan(**{where: ProviderAbort(f"hostile provider in {where}")})

    hostile = start_child(control, parent, label="hostile")
    snapshot = settle(control, hostile.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert f"hostile provider in {where}" in (outcome.detail or "")
    again = control.send_message(parent, healthy.child_id, text("still there?"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
