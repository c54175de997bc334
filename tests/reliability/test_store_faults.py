"""SPEC §5 send_message 2 (``DURABILITY_FAILED``) and §8 (transient store errors retried without
duplicates) with a store that fails on purpose, through the whole control plane.

`FlakyStore` is a real `SqlStore` whose per-attempt write methods raise the driver's own
transient errors (``database is locked`` for SQLite, a serialization failure for PostgreSQL,
both of which `persistence._retry.is_transient` retries): either before the attempt writes, or
right after it commits, as if the acknowledgement were lost. The store's one retry policy sees
them exactly as it would see the real thing.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from typing import Any, Literal

import psycopg
import pytest

from controlplane import (
    AgentHandle,
    ChildMeta,
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
)
from persistence import RetryPolicy, SqlStore
from persistence._appends import Appends
from persistence._codec import PendingEvent
from tests.fakes import FakeProvider
from tests.reliability.transcripts import frame_problems
from tests.support import (
    eventually,
    failed_outcome,
    idle_child,
    inbound,
    is_durable,
    kinds,
    mentioning,
    raises,
    running_child,
    settle,
    start_child,
    text,
)

Fault = Literal["before", "after"]
ATTEMPTS = 3


class FlakyStore(SqlStore):
    """A `SqlStore` that injects transient driver errors into chosen write attempts.

    ``append_faults[child_id]`` and ``create_faults[label]`` are queues of faults, one per
    attempt: ``"before"`` fails the attempt without writing, ``"after"`` fails it right
    after its commit. ``poisoned`` children and ``doomed`` labels fail every attempt.
    """

    def __init__(self, url: str) -> None:
        self.retries: list[str] = []
        self.append_faults: dict[str, list[Fault]] = {}
        self.create_faults: dict[str, list[Fault]] = {}
        self.poisoned: set[str] = set()
        self.doomed: set[str] = set()
        self._error: Callable[[], Exception] = (
            (lambda: sqlite3.OperationalError("database is locked"))
            if url.startswith("sqlite")
            else (lambda: psycopg.errors.SerializationFailure("could not serialize access"))
        )
        policy = RetryPolicy.immediate(
            max_attempts=ATTEMPTS, on_retry=lambda _n, exc: self.retries.append(str(exc))
        )
        super().__init__(url, retry=policy)
        self._appends = self._port.appends = _FlakyAppends(self)
        opening = self._claims._open_turn

        def open_turn(cursor: Any, task: Any, events: Any) -> None:
            # A resume's frame is written in its claim's transaction: a poisoned child
            # fails that transaction there (the claim and the Task row roll back with it).
            if task.child_id in self.poisoned:
                raise self._error()
            opening(cursor, task, events)

        self._claims._open_turn = open_turn  # type: ignore[method-assign]

    def _attempt(
        self,
        queue: list[Fault] | None,
        always: bool,
        write: Callable[[], list[SessionEvent]],
    ) -> list[SessionEvent]:
        """Run one write attempt, failing it as the next fault in ``queue`` (or always) says."""
        fault: Fault | None = "before" if always else (queue.pop(0) if queue else None)
        if fault == "before":
            raise self._error()
        stored = write()
        if fault == "after":
            raise self._error()
        return stored


class _FlakyAppends(Appends):
    """The store's write path, each attempt run through `FlakyStore._attempt`."""

    def __init__(self, store: FlakyStore) -> None:
        super().__init__(store._port)
        self._flaky = store

    def append(
        self,
        child_id: str,
        pending: list[PendingEvent],
        batch: str,
        created_at: datetime,
        attempt: int,
        *rest: Any,  # settle, fence, answer_steered: passed on as they came
    ) -> list[SessionEvent]:
        write = partial(super().append, child_id, pending, batch, created_at, attempt, *rest)
        flaky = self._flaky
        return flaky._attempt(flaky.append_faults.get(child_id), child_id in flaky.poisoned, write)

    def create(
        self,
        meta: ChildMeta,
        pending: list[PendingEvent],
        batch: str,
        created_at: datetime,
        attempt: int,
        claim: Any = None,
    ) -> list[SessionEvent]:
        label = meta.label or ""
        write = partial(super().create, meta, pending, batch, created_at, attempt, claim)
        flaky = self._flaky
        return flaky._attempt(flaky.create_faults.get(label), label in flaky.doomed, write)


@pytest.fixture
def store(store_url: str) -> Iterator[FlakyStore]:
    flaky = FlakyStore(store_url)
    yield flaky
    flaky.close()


@pytest.fixture
def control(store: FlakyStore, provider: FakeProvider) -> Iterator[SubagentControl]:
    with SubagentControl(store) as control:
        control.providers.register(provider)
        yield control


def stored(store: SqlStore, child_id: str) -> list[SessionEvent]:
    return store.load(child_id).events


def test_transient_failures_of_every_write_are_retried_and_nothing_is_written_twice(
    control: SubagentControl, store: FlakyStore, parent: AgentHandle, provider: FakeProvider
) -> None:
    # Each write of the child fails once, alternately before writing and after committing.
    store.create_faults["flaky"] = ["after", "before"]
    release = threading.Event()
    provider.plan(result_gate=release, writes=[(EventKind.ASSISTANT_MESSAGE, {"text": "held"})])
    start = start_child(control, parent, label="flaky")
    eventually(lambda: is_durable(control, start.child_id), "the run is published")
    child_id = start.child_id
    faults: list[Fault] = []
    for number in range(4):
        fault: Fault = "after" if number % 2 else "before"
        store.append_faults[child_id] = [fault]
        faults.append(fault)
        result = control.send_message(parent, child_id, text(f"steer {number}"))
        assert result.route == "steered"
        assert store.append_faults[child_id] == []  # the fault was used
    store.append_faults[child_id] = ["after"]  # the turn's end
    release.set()
    assert settle(control, start.task_id, parent).status is TaskStatus.COMPLETED
    store.append_faults[child_id] = ["before"]  # the resumed turn's frame
    again = control.send_message(parent, child_id, text("follow-up"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED

    events = stored(store, child_id)
    assert len(store.retries) == 2 + len(faults) + 2
    assert frame_problems(events, all_ended=True) == []
    for number in range(4):
        assert len(inbound(events, f"steer {number}")) == 1
    assert len(inbound(events, "follow-up")) == 1
    assert len(mentioning(events, "held")) == 1
    assert kinds(events).count(EventKind.DESCRIPTOR) == 1


def test_a_steer_whose_append_keeps_failing_raises_durability_failed_and_writes_nothing(
    control: SubagentControl,
    store: FlakyStore,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    child_id, task_id, _ = running_child(control, parent, provider, hold)
    before = stored(store, child_id)
    store.poisoned.add(child_id)

    with raises(ErrorCode.DURABILITY_FAILED):
        control.send_message(parent, child_id, text("remember this"))

    # The running turn has the message; the transcript does not, and nothing half-written.
    assert provider.steered_texts(child_id) == ["remember this"]
    assert stored(store, child_id) == before
    assert len(store.retries) == ATTEMPTS - 1
    # The turn cannot record its end through the poisoned append either: its Task ends
    # interrupted (SPEC §9 "Outages"), and its settlement, written apart, closes the turn.
    hold.set()
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.INTERRUPTED, snapshot
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.STORE_UNAVAILABLE
    assert "durability failed" in (snapshot.outcome.detail or "")
    after = stored(store, child_id)
    assert after[: len(before)] == before
    (end,) = after[len(before) :]
    assert (end.kind, end.data) == (
        EventKind.TURN_END,
        {"task_id": task_id, "status": "interrupted"},
    )


def test_a_store_failing_for_one_child_does_not_stop_the_control_plane_serving_others(
    control: SubagentControl,
    store: FlakyStore,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    sick, _, _ = running_child(control, parent, provider, hold, label="sick")
    store.poisoned.add(sick)
    healthy_gate = threading.Event()
    healthy, healthy_task, _ = running_child(
        control, parent, provider, healthy_gate, label="healthy"
    )

    with raises(ErrorCode.DURABILITY_FAILED):
        control.send_message(parent, sick, text("lost in the store"))
    assert control.send_message(parent, healthy, text("fine")).route == "steered"
    healthy_gate.set()
    assert settle(control, healthy_task, parent).status is TaskStatus.COMPLETED
    again = control.send_message(parent, healthy, text("still fine"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
    assert len(inbound(stored(store, healthy), "still fine")) == 1


def test_a_start_whose_publication_keeps_failing_fails_its_task_and_leaves_no_child(
    control: SubagentControl, store: FlakyStore, parent: AgentHandle, provider: FakeProvider
) -> None:
    store.doomed.add("doomed")
    plan = provider.plan()

    start = start_child(control, parent, label="doomed")
    snapshot = settle(control, start.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert outcome.code is ErrorCode.DURABILITY_FAILED
    assert "durability failed" in (outcome.detail or "")
    assert plan.disposed.is_set()  # the run it could not publish was disposed
    assert not is_durable(control, start.child_id)
    assert store.list_children(parent.session_id) == []
    other = start_child(control, parent, label="fine")
    assert settle(control, other.task_id, parent).status is TaskStatus.COMPLETED


def test_a_resume_whose_frame_keeps_failing_is_refused_and_leaves_the_transcript_as_it_was(
    control: SubagentControl, store: FlakyStore, parent: AgentHandle, provider: FakeProvider
) -> None:
    child_id = idle_child(control, parent)
    before = stored(store, child_id)
    tasks_before = control.tasks.list(requester=parent)
    store.poisoned.add(child_id)

    # The frame goes in with the claim, before `started`: a write that keeps failing is
    # the send's own failure (not delivered), and no Task was started.
    with pytest.raises(SubagentControlError) as refused:
        control.send_message(parent, child_id, text("will not stick"))

    assert refused.value.code is ErrorCode.STORE_UNAVAILABLE, refused.value
    assert stored(store, child_id) == before
    assert control.tasks.list(requester=parent) == tasks_before
    store.poisoned.clear()
    again = control.send_message(parent, child_id, text("this one sticks"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
    events = stored(store, child_id)
    assert frame_problems(events, all_ended=True) == []
    assert mentioning(events, "will not stick") == []
    assert [e.turn for e in events if e.kind == EventKind.TURN_START] == [1, 2]
