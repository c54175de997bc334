"""One activation's transcript writer: a steered message's record is queued by the
supervisor and written by whichever write of the turn comes first, always in order."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import pytest

from actors._transcript import ActivationTranscript
from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    SubagentControlError,
    TextBlock,
)
from controlplane.contract import ParkedTask
from persistence import SqlStore
from tests.support import raises

SOURCE = MessageSource(kind="human", sender_session_id="parent-1")


class RecordingStore:
    """Stands in for `SqlStore.append`: records each batch; fails while told to."""

    def __init__(self) -> None:
        self.batches: list[list[NewEvent]] = []
        self.failing = False

    def append(self, child_id: str, events: Sequence[NewEvent], **_options: Any) -> list[Any]:
        if self.failing:
            raise SubagentControlError(ErrorCode.STORE_UNAVAILABLE, "the disk is gone")
        self.batches.append(list(events))
        return []

    def abandoning(self, _abandoned: Callable[[], bool]) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # no waits to abandon: every append returns at once

    def abandon_waits(self, _thread_ids: Collection[int]) -> None:
        """Nothing to end: no append of this store ever waits."""

    def kinds(self) -> list[list[str]]:
        return [[event.kind for event in batch] for batch in self.batches]

    def texts(self) -> list[str]:
        return [e.data.get("text", "") for batch in self.batches for e in batch]


@pytest.fixture
def store() -> RecordingStore:
    return RecordingStore()


@pytest.fixture
def transcript(store: RecordingStore) -> ActivationTranscript:
    writer = ActivationTranscript(cast(SqlStore, store), "child-1", turn=2)
    writer.publish([NewEvent(kind=EventKind.TURN_START, turn=2, data={})])
    store.batches.clear()
    return writer


def steer(transcript: ActivationTranscript, text: str, delivered: list[str]) -> Any:
    return transcript.steer(
        lambda: delivered.append(text), [TextBlock(text=text)], SOURCE, task_id="task-1"
    )


def test_a_steer_hands_the_message_over_and_writes_nothing_until_committed(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    delivered: list[str] = []
    receipt = steer(transcript, "look at the schema", delivered)

    assert delivered == ["look at the schema"]
    assert store.batches == []
    receipt.commit()
    assert store.kinds() == [[EventKind.STEERING_MESSAGE]]
    assert store.batches[0][0].source == SOURCE
    assert store.batches[0][0].turn == 2


def test_the_runs_next_write_records_a_queued_steer_first_and_the_sender_does_not_rewrite(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    receipt = steer(transcript, "also check the index", [])

    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "checking the index"})
    receipt.commit()

    assert store.kinds() == [[EventKind.STEERING_MESSAGE], [EventKind.ASSISTANT_MESSAGE]]
    assert store.texts() == ["also check the index", "checking the index"]


def test_a_steer_queued_when_the_turn_ends_is_recorded_before_turn_end(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    receipt = steer(transcript, "one more thing", [])

    transcript.close({"task_id": "task-1", "status": "completed"})
    receipt.commit()

    assert store.kinds() == [[EventKind.STEERING_MESSAGE], [EventKind.TURN_END]]


def test_queued_steers_are_written_together_in_arrival_order(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    first = steer(transcript, "first", [])
    second = steer(transcript, "second", [])

    second.commit()
    first.commit()

    assert store.texts() == ["first", "second"]
    assert len(store.batches) == 1


def test_a_record_that_failed_to_write_is_never_written_after_what_followed_it(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    receipt = steer(transcript, "maybe lost", [])
    store.failing = True
    with raises(ErrorCode.STORE_UNAVAILABLE):
        transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "a reply"})
    store.failing = False

    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "a later reply"})
    with raises(ErrorCode.DURABILITY_FAILED) as raised:
        receipt.commit()

    assert raised.value.task_id == "task-1"
    assert store.texts() == ["a later reply"]


def test_a_steer_the_run_refuses_queues_nothing(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    def refuse() -> None:
        raise RuntimeError("the turn has ended")

    with raises(ErrorCode.NOT_DELIVERED):
        transcript.steer(refuse, [TextBlock(text="too late")], SOURCE, task_id="task-1")
    transcript.close({"task_id": "task-1", "status": "completed"})

    assert store.kinds() == [[EventKind.TURN_END]]


def test_a_parked_turn_stays_parked_once_closed(store: RecordingStore) -> None:
    # Its inbox and its supervisor read `parked` to hold messages for the parked Task's
    # continuation: the turn's close, which follows the park, must not turn it into an
    # ended turn (a steer would then be refused instead of carried on).
    writer = ActivationTranscript(cast(SqlStore, store), "child-1", turn=2, task_id="task-1")
    writer.publish([NewEvent(kind=EventKind.TURN_START, turn=2, data={})])
    assert writer.park_with(lambda: True)
    writer.close(None)

    assert writer.parked
    with pytest.raises(ParkedTask):
        steer(writer, "more", [])
    with raises(ErrorCode.CLOSED):
        writer.append("assistant/message", {"text": "late"})


END = {"task_id": "task-1", "status": "completed"}


def test_the_runs_last_reply_is_written_with_the_turns_end_in_one_batch(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    receipt = steer(transcript, "seen before the reply", [])

    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "done"}, last=True)
    assert store.batches == []  # kept for the end: nothing acknowledged it yet
    transcript.close(END)
    receipt.commit()

    assert store.kinds() == [
        [EventKind.STEERING_MESSAGE],
        [EventKind.ASSISTANT_MESSAGE, EventKind.TURN_END],
    ]


def test_a_last_reply_held_before_publication_waits_for_the_turns_end(
    store: RecordingStore,
) -> None:
    writer = ActivationTranscript(cast(SqlStore, store), "child-1", turn=2)
    writer.append(EventKind.ASSISTANT_MESSAGE, {"text": "thinking"})
    writer.append(EventKind.ASSISTANT_MESSAGE, {"text": "done"}, last=True)
    writer.publish([NewEvent(kind=EventKind.TURN_START, turn=2, data={})])
    writer.close(END)

    assert store.texts() == ["", "thinking", "done", ""]
    assert store.kinds() == [
        [EventKind.TURN_START, EventKind.ASSISTANT_MESSAGE],
        [EventKind.ASSISTANT_MESSAGE, EventKind.TURN_END],
    ]


def test_a_last_reply_whose_end_fails_is_not_written_apart_from_it(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "done"}, last=True)
    store.failing = True
    with raises(ErrorCode.DURABILITY_FAILED):
        transcript.close(END)

    assert store.batches == []  # both or neither: a recovered turn asks the model again


def test_a_write_after_the_last_reply_writes_the_kept_one_first(
    transcript: ActivationTranscript, store: RecordingStore
) -> None:
    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "done"}, last=True)
    transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": "an afterthought"})
    transcript.close(END)

    assert store.texts() == ["done", "an afterthought", ""]
