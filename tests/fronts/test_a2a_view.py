"""Our Tasks as A2A Tasks: each status's A2A state, the detail of one that did not complete,
the output as the one artifact, and the history as the messages of the Task's own turn."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.contract import EventKind, SessionEvent, TaskOutcome, TaskSnapshot, TaskStatus
from tests.fronts.a2a_support import TaskState

# isort: skip: after a2a_support, which skips the module when the a2a extra is missing.
from controlplane.fronts._a2a_view import a2a_state, task_view, turn_of  # isort: skip

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def snapshot(status: str, outcome: TaskOutcome | None = None) -> TaskSnapshot:
    return TaskSnapshot(
        id="task-1",
        label="research X",
        owner_session="a2a",
        status=TaskStatus(status),
        outcome=outcome,
        child_id="child-1",
        created_at=NOW,
    )


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("running", TaskState.TASK_STATE_WORKING),
        ("queued", TaskState.TASK_STATE_WORKING),
        ("completed", TaskState.TASK_STATE_COMPLETED),
        ("failed", TaskState.TASK_STATE_FAILED),
        ("killed", TaskState.TASK_STATE_CANCELED),
        ("interrupted", TaskState.TASK_STATE_FAILED),
    ],
)
def test_each_status_has_its_a2a_state(status: str, state: int) -> None:
    assert a2a_state(snapshot(status)) == state


def test_an_interrupted_task_reads_failed_with_its_detail() -> None:
    lost = TaskOutcome(status=TaskStatus.INTERRUPTED, detail="runtime r1 interrupted: lease lost")

    task = task_view(snapshot("interrupted", lost))

    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert task.status.message.parts[0].text == "runtime r1 interrupted: lease lost"
    assert list(task.artifacts) == []


def test_a_completed_task_has_its_output_as_its_artifact() -> None:
    done = TaskOutcome(status=TaskStatus.COMPLETED, output="three facts")

    task = task_view(snapshot("completed", done))

    assert task.context_id == "child-1"
    assert [a.parts[0].text for a in task.artifacts] == ["three facts"]
    assert not task.status.HasField("message")


def event(seq: int, turn: int, kind: str, data: dict[str, object]) -> SessionEvent:
    return SessionEvent(seq=seq, turn=turn, kind=kind, data=data, created_at=NOW)


def test_the_history_is_the_messages_of_the_tasks_own_turn() -> None:
    stored = [
        event(1, 1, EventKind.TURN_START, {"task_id": "task-0"}),
        event(2, 1, EventKind.USER_MESSAGE, {"text": "earlier"}),
        event(3, 1, EventKind.TURN_END, {}),
        event(4, 2, EventKind.TURN_START, {"task_id": "task-1"}),
        event(5, 2, EventKind.USER_MESSAGE, {"text": "go"}),
        event(6, 2, EventKind.STEERING_MESSAGE, {"text": "also this"}),
        event(7, 2, "tool/call", {"id": "c1", "name": "look", "arguments": {}}),
        event(8, 2, EventKind.ASSISTANT_MESSAGE, {"text": "done"}),
    ]

    task = task_view(snapshot("running"), turn_of(stored, "task-1"))

    assert [(m.role, m.parts[0].text) for m in task.history] == [
        (1, "go"),
        (1, "also this"),
        (2, "done"),
    ]
    assert [m.message_id for m in task.history] == ["child-1:5", "child-1:6", "child-1:8"]
    assert turn_of(stored, "task-9") == []
