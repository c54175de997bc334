"""SPEC §9 "Outages": a store outage at any point of a turn's settlement ends its Task
``interrupted`` at worst, never ``failed``, and never leaves its turn open behind it.

`OutageStore` is a real `SqlStore` whose every operation fails with the driver's own
transient error from a chosen call on (``database is locked`` for SQLite, a connection
failure for PostgreSQL), before the attempt runs or right after it committed (an
acknowledgement lost with the server), until the test ends the outage: each failing
operation exhausts the store's retry budget, as a real outage longer than it does. The
invariant checked after each outage, with the store back: every settled Task of the child
has exactly one ``turn/end`` (with its status), and no turn begins before the one before
it ended.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

import psycopg
import pytest

from controlplane import AgentHandle, EventKind, SubagentControl, TaskStatus
from persistence import RetryPolicy, SqlStore
from tests.fakes import FakeProvider
from tests.reliability.transcripts import frame_problems, turns_of
from tests.support import running_child, settle, text

T = TypeVar("T")
Mode = Literal["before", "after"]


class OutageStore(SqlStore):
    """A `SqlStore` whose operations fail transiently while an outage lasts.

    `begin(after_calls, mode, lasting=None)` starts the outage at the ``after_calls``-th
    attempt from now (0: the next one); every attempt from there fails (``before``:
    nothing runs; ``after``: the first one commits, then fails as if its acknowledgement
    were lost) for ``lasting`` attempts, or until `end`.
    """

    def __init__(self, url: str) -> None:
        self._lock = threading.Lock()
        self._countdown: int | None = None
        self._lasting: int | None = None
        self._mode: Mode = "before"
        self._down = False
        self._error: Callable[[], Exception] = (
            (lambda: sqlite3.OperationalError("database is locked"))
            if url.startswith("sqlite")
            else (lambda: psycopg.OperationalError("server closed the connection unexpectedly"))
        )
        super().__init__(url, retry=RetryPolicy.immediate(max_attempts=2))

    def begin(self, after_calls: int, mode: Mode, lasting: int | None = None) -> None:
        with self._lock:
            self._countdown, self._mode, self._lasting = after_calls, mode, lasting
            self._down = False

    def end(self) -> None:
        with self._lock:
            self._countdown, self._down = None, False

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        def attempt(number: int) -> T:
            commit_first = False
            with self._lock:
                if self._countdown is not None and not self._down:
                    if self._countdown == 0:
                        self._down = True
                        commit_first = self._mode == "after"
                    else:
                        self._countdown -= 1
                if self._down and self._lasting is not None:
                    self._lasting -= 1
                    if self._lasting < 0:  # over: this attempt runs
                        self._countdown, self._down = None, False
                down = self._down
            if not down:
                return operation(number)
            if commit_first:
                operation(number)
            raise self._error()

        return super()._run(action, attempt)


@pytest.fixture
def store(store_url: str) -> Iterator[OutageStore]:
    opened = OutageStore(store_url)
    yield opened
    opened.close()


@pytest.fixture
def control(store: OutageStore, provider: FakeProvider) -> Iterator[SubagentControl]:
    with SubagentControl(store) as opened:
        opened.providers.register(provider)
        yield opened


def closed_turn_problems(control: SubagentControl, parent: AgentHandle, child_id: str) -> list[str]:
    """What breaks the invariant: a settled Task whose turn has not exactly one
    ``turn/end`` with its status, a turn begun before the one before it ended, or a Task
    this runtime reports otherwise than the store."""
    assert control.store is not None
    events = control.store.load(child_id).events
    problems = frame_problems(events, all_ended=False)
    turns = {turn.task_id: turn for turn in turns_of(events)}
    for listed in control.tasks.list(parent):
        if listed.child_id != child_id:
            continue
        task = control.tasks.get(listed.id, requester=parent)  # this runtime's own answer
        if not task.status.is_terminal:
            continue
        stored = control.store.ledger.get(task.id)
        assert stored is not None
        if stored.status is not task.status:
            problems.append(f"task {task.id}: {task.status} here, {stored.status} in the store")
        turn = turns.get(task.id)
        if turn is None:
            continue  # never published: no turn of its own
        ends = [e for e in turn.events if e.kind == EventKind.TURN_END]
        if len(ends) != 1:
            problems.append(f"turn {turn.number} of settled task {task.id} has {len(ends)} ends")
        elif not isinstance(ends[0].data, dict) or ends[0].data.get("status") != task.status:
            problems.append(f"turn {turn.number} ends {ends[0].data}, its task is {task.status}")
    return problems


def test_an_outage_longer_than_the_retry_budget_at_a_turns_end_interrupts_its_task_and_closes_its_turn_once_back(  # noqa: E501
    control: SubagentControl, store: OutageStore, parent: AgentHandle, provider: FakeProvider
) -> None:
    gate = threading.Event()
    child_id, task_id, _ = running_child(control, parent, provider, gate)
    store.begin(0, "before")  # down from the turn's end on

    gate.set()
    snapshot = settle(control, task_id, parent)

    # An outage ends a running Task interrupted, never failed (SPEC §9 "Outages").
    assert snapshot.status is TaskStatus.INTERRUPTED, snapshot
    assert snapshot.outcome is not None
    assert "interrupted" in (snapshot.outcome.detail or "")
    store.end()
    # The next message resumes the child on top of a closed turn: its end says interrupted.
    again = control.send_message(parent, child_id, text("go on"))
    assert again.route == "started"
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
    assert control.store is not None
    assert control.store.ledger.get(task_id).status is TaskStatus.INTERRUPTED  # type: ignore[union-attr]
    assert closed_turn_problems(control, parent, child_id) == []
    turns = turns_of(control.store.load(child_id).events)
    assert [t.task_id for t in turns] == [task_id, again.task_id]
    assert all(t.ended for t in turns)


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.slow  # measured: 6 s under load (--durations)
def test_an_outage_beginning_and_ending_at_any_point_of_a_settlement_leaves_every_settled_task_with_one_closed_turn(  # noqa: E501
    control: SubagentControl,
    store: OutageStore,
    parent: AgentHandle,
    provider: FakeProvider,
    mode: Mode,
) -> None:
    # Each outage begins at one of the settlement's store calls and lasts some attempts
    # (two exhaust the budget of one operation: the next one finds the store back), or
    # until the Task has settled here.
    for point in range(4):
        for lasting in (1, 2, 3, 4, None):
            gate = threading.Event()
            child_id, task_id, _ = running_child(control, parent, provider, gate)
            store.begin(point, mode, lasting)
            gate.set()
            snapshot = settle(control, task_id, parent)
            assert snapshot.status in (TaskStatus.COMPLETED, TaskStatus.INTERRUPTED), snapshot
            store.end()
            again = control.send_message(parent, child_id, text("after the outage"))
            assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
            problems = closed_turn_problems(control, parent, child_id)
            assert problems == [], (point, lasting, mode)
