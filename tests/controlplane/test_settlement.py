"""SPEC §5 outcomes, settlement and cancellation."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    SubagentControl,
    SubagentControlError,
    SubagentResult,
    TaskSnapshot,
    TaskStatus,
)
from tests.fakes import FakeProvider, completed
from tests.support import (
    WAIT_S,
    failed_outcome,
    in_thread,
    is_durable,
    raises,
    running_child,
    settle,
    start_child,
    starting_child,
    text,
)


def run_to_outcome(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, **script: object
) -> TaskSnapshot:
    provider.plan(**script)
    return settle(control, start_child(control, parent).task_id, parent)


def test_a_completed_result_completes_with_the_concatenated_text(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    result = SubagentResult(stop_reason="completed", output=text("Hello, ", "world", "!"))

    snapshot = run_to_outcome(control, parent, provider, result=result)

    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.status is TaskStatus.COMPLETED
    assert snapshot.outcome.output == "Hello, world!"
    assert control.tasks.output(snapshot.id, requester=parent) == "Hello, world!"
    assert snapshot.ended_at is not None
    assert snapshot.ended_at >= snapshot.created_at


def test_an_aborted_result_is_killed(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    snapshot = run_to_outcome(
        control, parent, provider, result=SubagentResult(stop_reason="aborted")
    )

    assert snapshot.status is TaskStatus.KILLED


@pytest.mark.parametrize("reason", ["error", "max-tokens", "refusal", "rate-limited"])
def test_any_other_stop_reason_fails_with_the_reason_as_detail(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, reason: str
) -> None:
    result = SubagentResult(stop_reason=reason, output=text("partial"))

    snapshot = run_to_outcome(control, parent, provider, result=result)

    outcome = failed_outcome(snapshot)
    assert outcome.detail == reason
    assert control.tasks.output(snapshot.id, requester=parent) == reason


@pytest.mark.parametrize(
    ("script", "detail"),
    [
        pytest.param(
            {"result": RuntimeError("the model connection dropped")},
            "the model connection dropped",
            id="result-raises",
        ),
        pytest.param(
            {
                "result": SubagentResult(stop_reason="refusal"),
                "fail_dispose": RuntimeError("socket leaked"),
            },
            "refusal; dispose failed: socket leaked",
            id="dispose-raises-after-a-refusal",
        ),
    ],
)
def test_a_raising_result_or_dispose_fails_with_the_error_text_after_the_earlier_detail(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    script: dict[str, object],
    detail: str,
) -> None:
    snapshot = run_to_outcome(control, parent, provider, **script)

    assert failed_outcome(snapshot).detail == detail


def test_a_raising_dispose_fails_even_a_completed_turn(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    snapshot = run_to_outcome(
        control,
        parent,
        provider,
        result=completed("fine"),
        fail_dispose=RuntimeError("socket leaked"),
    )

    outcome = failed_outcome(snapshot)
    assert (outcome.detail or "").endswith("dispose failed: socket leaked")


def outcome_logger(control: SubagentControl, provider: FakeProvider) -> None:
    control.tasks.on_done(lambda snapshot: provider.record(("outcome", snapshot.child_id or "?")))


def test_settlement_order_is_result_then_dispose_then_outcome(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    outcome_logger(control, provider)

    started = start_child(control, parent)
    settle(control, started.task_id, parent)

    child = started.child_id
    assert [entry for entry in provider.log if entry[1] == child] == [
        ("start", child),
        ("result", child),
        ("dispose", child),
        ("outcome", child),
    ]


def test_the_association_exists_while_on_done_listeners_run(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    provider.plan(result_gate=release)
    started = start_child(control, parent)
    seen: list[object] = []

    def listener(snapshot: TaskSnapshot) -> None:
        if snapshot.id != started.task_id:
            return
        # Send from another thread and wait for it here, so a listener that runs inside an
        # actor cannot deadlock the test (it fails on the timeout instead).
        sending = in_thread(lambda: control.send_message(parent, started.child_id, text("hi")))
        try:
            seen.append(sending.result(2.0))
        except Exception as exc:
            seen.append(exc)

    control.tasks.on_done(listener)
    release.set()
    settle(control, started.task_id, parent)

    (error,) = seen
    assert isinstance(error, SubagentControlError), error
    assert error.code is ErrorCode.NOT_DELIVERED
    assert "completed" in error.message
    assert "retry after it settles" in error.message
    assert provider.resumes == []


def test_a_follow_up_right_after_wait_starts_the_next_activation(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    for _ in range(20):
        started = start_child(control, parent)
        settle(control, started.task_id, parent)

        result = control.send_message(parent, started.child_id, text("next"))

        assert result.route == "started"
        assert result.task_id != started.task_id
        assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED


def test_a_terminal_task_leaves_the_durable_child_but_no_live_child_agent(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    child_id, task_id, _ = running_child(control, parent, provider, release, local_agent=True)
    assert control.agents.get(child_id) is not None

    release.set()
    settle(control, task_id, parent)

    assert control.agents.get(child_id) is None
    assert is_durable(control, child_id)


def test_kill_before_publication_rolls_the_provider_back_and_leaves_nothing_durable(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    started, plan = starting_child(control, parent, provider)

    control.tasks.kill(started.task_id, requester=parent)

    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    assert plan.rolled_back.is_set()
    assert provider.total_live() == 0
    assert not is_durable(control, started.child_id)
    assert control.store is not None
    assert control.store.list_children(parent.session_id) == []


def test_kill_after_publication_records_killed_only_after_dispose(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    outcome_logger(control, provider)
    dispose_gate = threading.Event()
    plan = provider.plan(result_gate=threading.Event(), dispose_gate=dispose_gate)
    started = start_child(control, parent)
    assert control.send_message(parent, started.child_id, text("ping")).route == "steered"

    control.tasks.kill(started.task_id, requester=parent)  # returns once requested
    assert plan.settled.wait(WAIT_S)
    assert control.tasks.get(started.task_id, requester=parent).status is TaskStatus.RUNNING
    dispose_gate.set()

    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    child = started.child_id
    assert [entry for entry in provider.log if entry[1] == child][-3:] == [
        ("result", child),
        ("dispose", child),
        ("outcome", child),
    ]
    assert is_durable(control, child)


def test_killing_a_settled_task_is_a_no_op(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    started = start_child(control, parent)
    before = settle(control, started.task_id, parent)

    control.tasks.kill(started.task_id, requester=parent)

    assert control.tasks.get(started.task_id, requester=parent) == before


def test_disposing_the_owner_kills_its_tasks(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
) -> None:
    gate = threading.Event()
    unpublished = provider.plan(start_gate=gate)
    mine_early = start_child(control, parent)
    assert unpublished.entered.wait(WAIT_S)
    published = provider.plan(result_gate=threading.Event())
    mine_late = start_child(control, parent)
    assert published.returned.wait(WAIT_S)
    other_release = threading.Event()
    other_plan = provider.plan(result_gate=other_release)
    theirs = start_child(control, stranger)
    assert other_plan.returned.wait(WAIT_S)

    parent.dispose()

    for task_id in (mine_early.task_id, mine_late.task_id):
        assert settle(control, task_id, parent.session_id).status is TaskStatus.KILLED
    assert unpublished.rolled_back.is_set()
    assert published.disposed.is_set()
    assert control.tasks.get(theirs.task_id, requester=stranger).status is TaskStatus.RUNNING
    other_release.set()
    assert settle(control, theirs.task_id, stranger).status is TaskStatus.COMPLETED


def test_wait_times_out_on_a_running_task(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    provider.plan(result_gate=release)
    started = start_child(control, parent)

    with raises(ErrorCode.TIMEOUT):
        control.tasks.wait(started.task_id, timeout=0.05, requester=parent)
    release.set()
    settle(control, started.task_id, parent)


def test_killed_is_recorded_only_after_the_provider_rolled_back(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    rollback_gate = threading.Event()
    plan = provider.plan(start_gate=threading.Event(), rollback_gate=rollback_gate)
    rolled_back_at_outcome: list[bool] = []
    control.tasks.on_done(lambda snapshot: rolled_back_at_outcome.append(plan.rolled_back.is_set()))
    started = start_child(control, parent)
    assert plan.entered.wait(WAIT_S)

    control.tasks.kill(started.task_id, requester=parent)
    assert plan.rolling_back.wait(WAIT_S)  # the provider is still rolling back

    assert control.tasks.get(started.task_id, requester=parent).status is TaskStatus.RUNNING
    rollback_gate.set()
    assert settle(control, started.task_id, parent).status is TaskStatus.KILLED
    assert rolled_back_at_outcome == [True]
