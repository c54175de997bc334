"""A live Task's entry in the ledger (`controlplane.runtime.tasks._task_entry.TaskEntry`):
its state is one frozen `TaskSnapshot`, replaced whole on each change, with no second
copy of its status, request or queue times beside it."""

from __future__ import annotations

from controlplane import CancelSignal, TaskOutcome, TaskSnapshot, TaskStatus
from controlplane.contract import ApprovalRequest, utcnow
from controlplane.runtime.tasks._task_entry import TaskEntry

REQUEST = ApprovalRequest(id="r1", tool="deploy", arguments={"env": "prod"})


def _entry(status: TaskStatus) -> TaskEntry:
    snapshot = TaskSnapshot(
        id="t1", label="x", owner_session="p1", status=status, created_at=utcnow()
    )
    return TaskEntry(snapshot, CancelSignal())


def test_a_queued_task_asked_and_answered_reads_queued_again_until_admitted() -> None:
    entry = _entry(TaskStatus.QUEUED)
    queued_at = utcnow()
    assert entry.queue_as(True, queued_at, None).status is TaskStatus.QUEUED

    asked = entry.ask_as(REQUEST)
    assert (asked.status, asked.request) == (TaskStatus.INPUT_REQUIRED, REQUEST)
    assert entry.resting.is_set()
    # Admitted while it waits for the answer: it still reads the request.
    admitted_at = utcnow()
    assert entry.queue_as(False, queued_at, admitted_at).status is TaskStatus.INPUT_REQUIRED

    answered = entry.ask_as(None)
    assert (answered.status, answered.request) == (TaskStatus.RUNNING, None)
    assert not entry.resting.is_set()
    assert (answered.queued_at, answered.admitted_at) == (queued_at, admitted_at)


def test_an_answer_taken_while_it_still_waits_for_a_slot_reads_queued() -> None:
    entry = _entry(TaskStatus.RUNNING)
    entry.ask_as(REQUEST)
    entry.queue_as(True, utcnow(), None)
    assert entry.view.status is TaskStatus.INPUT_REQUIRED
    assert entry.ask_as(None).status is TaskStatus.QUEUED


def test_a_kill_s_cleared_request_leaves_a_queued_task_queued() -> None:
    # A kill clears the Task's request (`asking(None)`) whatever it was doing: one queued
    # before its admission decided (no queue times yet) reads queued still.
    entry = _entry(TaskStatus.QUEUED)
    assert entry.ask_as(None).status is TaskStatus.QUEUED


def test_settling_drops_the_request_and_names_the_outcome_once() -> None:
    entry = _entry(TaskStatus.RUNNING)
    entry.ask_as(REQUEST)
    at = utcnow()
    settled = entry.settle_as(TaskOutcome(status=TaskStatus.COMPLETED, output="ok"), at)
    assert (settled.status, settled.request) == (TaskStatus.COMPLETED, None)
    assert settled.settled_at == settled.ended_at == at
    assert entry.outcome is settled.outcome
    assert (entry.id, entry.owner, entry.child_id) == ("t1", "p1", None)
