"""Our Tasks and transcripts as A2A sees them: pure functions, no I/O.

A Task's A2A ``id`` is our Task id and its ``contextId`` our child id. Its status comes
from the Task row, its history and its streamed updates from the child's transcript (the
turn whose ``turn/start`` names the Task), and its one artifact, ``output``, from the
outcome of a completed Task. Everything is derived from the store, so any server process
on it gives the same answer, also after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)

from controlplane.contract import EventKind, SessionEvent, TaskSnapshot
from controlplane.fronts._a2a_answers import request_message

__all__ = [
    "OUTPUT_ARTIFACT",
    "TERMINAL_STATES",
    "a2a_state",
    "final_events",
    "message_of",
    "status_of",
    "task_view",
    "turn_of",
    "update_of",
]

OUTPUT_ARTIFACT: Final = "output"
"""The id of a completed Task's artifact: its output."""

# Our statuses by value: `input_required` arrives with the approvals.
_STATES: Final[dict[str, TaskState]] = {
    "running": TaskState.TASK_STATE_WORKING,
    "queued": TaskState.TASK_STATE_WORKING,
    "input_required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "killed": TaskState.TASK_STATE_CANCELED,
    "interrupted": TaskState.TASK_STATE_FAILED,
}

TERMINAL_STATES: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
"""The states after which a Task takes no message (A2A: rejected with an error)."""

_INBOUND: Final = {
    EventKind.USER_MESSAGE: Role.ROLE_USER,
    EventKind.STEERING_MESSAGE: Role.ROLE_USER,
}


def a2a_state(snapshot: TaskSnapshot) -> TaskState:
    """The A2A state of one of our Tasks (``interrupted`` reads ``failed``)."""
    return _STATES.get(str(snapshot.status.value), TaskState.TASK_STATE_WORKING)


def status_of(snapshot: TaskSnapshot) -> TaskStatus:
    """The Task's A2A status; a failed, cancelled or interrupted one carries its detail as
    an agent message, one waiting on an approval its request (`request_message`)."""
    status = TaskStatus(state=a2a_state(snapshot))
    status.timestamp.FromDatetime(snapshot.settled_at or snapshot.created_at)
    if snapshot.request is not None and status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
        status.message.CopyFrom(request_message(snapshot, snapshot.request))
        return status
    outcome = snapshot.outcome
    if outcome is not None and outcome.detail and status.state != TaskState.TASK_STATE_COMPLETED:
        detail = outcome.detail
        if snapshot.status.value == "interrupted" and "interrupted" not in detail:
            detail = f"interrupted: {detail}"
        status.message.CopyFrom(
            Message(
                message_id=f"{snapshot.id}:status",
                context_id=snapshot.child_id or "",
                task_id=snapshot.id,
                role=Role.ROLE_AGENT,
                parts=[Part(text=detail)],
            )
        )
    return status


def turn_of(events: Sequence[SessionEvent], task_id: str) -> list[SessionEvent]:
    """The events of the turn whose ``turn/start`` names ``task_id`` (none before it opens)."""
    turn = next(
        (
            event.turn
            for event in events
            if event.kind == EventKind.TURN_START
            and isinstance(event.data, dict)
            and event.data.get("task_id") == task_id
        ),
        None,
    )
    return [] if turn is None else [event for event in events if event.turn == turn]


def message_of(event: SessionEvent, *, child_id: str, task_id: str) -> Message | None:
    """An inbound or assistant message of the transcript as an A2A message, else None.

    Its id is the event's place in the transcript, so every process names it alike.
    """
    role = _INBOUND.get(event.kind)
    if role is None and event.kind == EventKind.ASSISTANT_MESSAGE:
        role = Role.ROLE_AGENT
    text = event.data.get("text") if isinstance(event.data, dict) else None
    if role is None or not isinstance(text, str) or not text:
        return None
    return Message(
        message_id=f"{child_id}:{event.seq}",
        context_id=child_id,
        task_id=task_id,
        role=role,
        parts=[Part(text=text)],
    )


def output_artifact(snapshot: TaskSnapshot) -> Artifact | None:
    """A completed Task's output as its one artifact."""
    outcome = snapshot.outcome
    if snapshot.status.value != "completed" or outcome is None:
        return None
    return Artifact(
        artifact_id=OUTPUT_ARTIFACT, name="output", parts=[Part(text=outcome.output or "")]
    )


def task_view(snapshot: TaskSnapshot, turn: Iterable[SessionEvent] = ()) -> Task:
    """The A2A Task of one of our Tasks, its history the messages of ``turn``."""
    child_id = snapshot.child_id or ""
    task = Task(id=snapshot.id, context_id=child_id, status=status_of(snapshot))
    for event in turn:
        message = message_of(event, child_id=child_id, task_id=snapshot.id)
        if message is not None:
            task.history.append(message)
    artifact = output_artifact(snapshot)
    if artifact is not None:
        task.artifacts.append(artifact)
    task.metadata.update({"label": snapshot.label, "status": str(snapshot.status.value)})
    return task


def update_of(event: SessionEvent, snapshot: TaskSnapshot) -> TaskStatusUpdateEvent | None:
    """A transcript event as a streamed update: each message of the turn, while it works."""
    child_id = snapshot.child_id or ""
    message = message_of(event, child_id=child_id, task_id=snapshot.id)
    if message is None:
        return None
    status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=message)
    status.timestamp.FromDatetime(event.created_at)
    return TaskStatusUpdateEvent(task_id=snapshot.id, context_id=child_id, status=status)


def final_events(
    snapshot: TaskSnapshot,
) -> list[TaskArtifactUpdateEvent | TaskStatusUpdateEvent]:
    """What ends a Task's stream: its output artifact (completed), then its status."""
    child_id = snapshot.child_id or ""
    events: list[TaskArtifactUpdateEvent | TaskStatusUpdateEvent] = []
    artifact = output_artifact(snapshot)
    if artifact is not None:
        events.append(
            TaskArtifactUpdateEvent(
                task_id=snapshot.id, context_id=child_id, artifact=artifact, last_chunk=True
            )
        )
    events.append(
        TaskStatusUpdateEvent(task_id=snapshot.id, context_id=child_id, status=status_of(snapshot))
    )
    return events
