"""SPEC §5 send_message 2 and §8: a steer's durable commit under transient store failures.

The SQLite file is locked from outside the store (a raw ``sqlite3`` writer holding
``BEGIN IMMEDIATE``), which is exactly the "database is locked" a second process causes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    TaskStatus,
)
from persistence import RetryPolicy, SqlStore
from tests.fakes import FakeProvider
from tests.support import (
    WAIT_S,
    carrying,
    events,
    in_thread,
    raises,
    running_child,
    settle,
    text,
)


class Retries:
    """Counts the store's retries and lets a test wait for the first one."""

    def __init__(self) -> None:
        self.count = 0
        self.first = threading.Event()

    def __call__(self, attempt: int, error: BaseException) -> None:
        self.count += 1
        self.first.set()


@pytest.fixture
def db_path(tmp_path: object) -> str:
    return f"{tmp_path}/faults.db"


@pytest.fixture
def retries() -> Retries:
    return Retries()


def open_control(
    db_path: str, provider: FakeProvider, retries: Retries, *, max_attempts: int
) -> SubagentControl:
    # A short busy timeout turns the outside lock into a quick, retryable "locked" error.
    policy = RetryPolicy.immediate(max_attempts=max_attempts, on_retry=retries)
    store = SqlStore(f"sqlite:///{db_path}?timeout=0.02", retry=policy)
    control = SubagentControl(store)
    control.providers.register(provider)
    return control


class OutsideWriter:
    """A raw sqlite3 connection that takes the database's write lock, as another process would."""

    def __init__(self, db_path: str) -> None:
        self._db_path = db_path
        self._conn: sqlite3.Connection | None = None

    def lock(self) -> None:
        self._conn = sqlite3.connect(self._db_path, isolation_level=None)
        self._conn.execute("BEGIN IMMEDIATE")

    def unlock(self) -> None:
        assert self._conn is not None
        self._conn.execute("COMMIT")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@pytest.fixture
def outside(db_path: str) -> Iterator[OutsideWriter]:
    writer = OutsideWriter(db_path)
    yield writer
    writer.close()


def test_a_steer_committed_after_transient_lock_errors_is_stored_and_steered_once(
    db_path: str, provider: FakeProvider, retries: Retries, outside: OutsideWriter
) -> None:
    release = threading.Event()
    with open_control(db_path, provider, retries, max_attempts=500) as control:
        parent = control.agents.register("parent-1")
        child_id, task_id, _ = running_child(control, parent, provider, release)
        outside.lock()

        sending = in_thread(lambda: control.send_message(parent, child_id, text("persist me")))
        assert retries.first.wait(WAIT_S)
        outside.unlock()
        result = sending.result(WAIT_S)

        assert (result.route, result.task_id) == ("steered", task_id)
        assert retries.count >= 1
        (event,) = carrying(events(control, child_id), "persist me")
        assert event.kind == EventKind.STEERING_MESSAGE
        assert event.source == MessageSource(kind="coordinator", sender_session_id="parent-1")
        # A store retry never steers the message into the run a second time.
        assert provider.steered_texts(child_id) == ["persist me"]
        release.set()
        assert settle(control, task_id, parent).status is TaskStatus.COMPLETED


def test_a_steer_whose_commit_keeps_failing_raises_durability_failed(
    db_path: str, provider: FakeProvider, retries: Retries, outside: OutsideWriter
) -> None:
    release = threading.Event()
    with open_control(db_path, provider, retries, max_attempts=2) as control:
        parent = control.agents.register("parent-1")
        child_id, task_id, _ = running_child(control, parent, provider, release)
        outside.lock()

        with raises(ErrorCode.DURABILITY_FAILED):
            control.send_message(parent, child_id, text("maybe lost"))

        # The one raise that does not mean "not delivered": the running turn has it.
        assert provider.steered_texts(child_id) == ["maybe lost"]
        outside.unlock()
        release.set()
        assert settle(control, task_id, parent).status.is_terminal
