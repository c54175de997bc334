"""Holes an outside review found in the single-process core (issue 13), each held shut.

Every test here failed before its fix: a supervisor that died on its own exception wedged
its child; a failed commit let other senders report ``steered`` with no record; a raw
``RuntimeError`` escaped the API; a foreign parent's resume answered the real parent
``TASK_NOT_FOUND``; ``close`` left Tasks ``running``; nothing capped live activations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from actors._pool import actor_threads, non_daemon_actor_threads
from actors._transcript import ActivationTranscript
from controlplane import (
    AgentHandle,
    ChildMeta,
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    TaskStatus,
)
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    MakeControl,
    events,
    eventually,
    gated_control,
    held_messages,
    idle_child,
    in_thread,
    inbound,
    kinds,
    raises,
    running_child,
    settle,
    start_child,
    starting_child,
    supervised,
    text,
)


@pytest.fixture
def fail_thread_start(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Arm ``threading.Thread.start`` to raise once for the next thread whose name starts
    with the given prefix (pykka names an actor's thread after its class)."""
    real_start = threading.Thread.start
    armed: list[str] = []

    def start(thread: threading.Thread) -> None:
        if armed and thread.name.startswith(armed[0]):
            armed.clear()
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    # A pooled actor (the activation) starts no thread while a worker waits for it: keep
    # none waiting, so each of its starts is a thread start the test can fail.
    for pool in (actor_threads, non_daemon_actor_threads):
        monkeypatch.setattr(pool, "max_idle", 0)
        pool.drain()
    return armed.append


# -- 1. a supervisor's own failure settles, fails held messages, and retires ----------------------


def test_a_resume_whose_activation_thread_cannot_start_fails_and_the_next_message_works(
    control: SubagentControl, parent: AgentHandle, fail_thread_start: Callable[[str], None]
) -> None:
    child = idle_child(control, parent)
    fail_thread_start("ActivationActor")

    # The resume's claim runs on its activation's thread: with none, nothing was claimed
    # and nothing written, and the sender is told to retry.
    with raises(ErrorCode.INTERNAL, match="can't start new thread"):
        control.send_message(parent, child, text("one"))
    eventually(lambda: child not in supervised(control), "the failed supervisor retired")
    assert inbound(events(control, child), "one") == []

    again = control.send_message(parent, child, text("two"))
    assert again.route == "started"
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
    assert len(inbound(events(control, child), "two")) == 1


def test_a_start_whose_activation_thread_cannot_start_fails_and_leaves_no_child(
    control: SubagentControl, parent: AgentHandle, fail_thread_start: Callable[[str], None]
) -> None:
    fail_thread_start("ActivationActor")

    started = start_child(control, parent)

    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert "can't start new thread" in (snapshot.outcome.detail or "")  # type: ignore[union-attr]
    assert control.store is not None
    assert [m.child_id for m in control.store.list_children(parent.session_id)] == []
    assert control.children(parent) == []


def test_a_supervisor_failing_at_publication_fails_its_task_and_held_messages(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
    hold: threading.Event,
) -> None:
    gate = threading.Event()
    started, _plan = starting_child(control, parent, provider, gate, result_gate=hold)
    held = in_thread(lambda: control.send_message(parent, started.child_id, text("held")))
    eventually(lambda: held_messages(control, started.child_id) == 1, "the message is held")
    # The registry fails once, inside the supervisor's publication check.
    real_get = control.agents.get

    def failing_get(session_id: str) -> AgentHandle | None:
        if session_id == started.child_id:
            monkeypatch.setattr(control.agents, "get", real_get)
            raise RuntimeError("registry fault")
        return real_get(session_id)

    monkeypatch.setattr(control.agents, "get", failing_get)
    gate.set()

    with raises(ErrorCode.NOT_DELIVERED, match="registry fault"):
        held.result(timeout=WAIT_S)
    snapshot = settle(control, started.task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.INTERNAL
    assert "registry fault" in (snapshot.outcome.detail or "")
    stored = events(control, started.child_id)
    assert inbound(stored, "held") == []
    assert kinds(stored)[-1] == EventKind.TURN_END
    eventually(lambda: started.child_id not in supervised(control), "the supervisor retired")

    after = control.send_message(parent, started.child_id, text("after"))
    assert after.route == "started"
    assert settle(control, after.task_id, parent).status is TaskStatus.COMPLETED


# -- 2. every receipt ends written or failed, whatever escapes ---------------------------------


class _InterruptingStore(SqlStore):
    """A real store whose next append raises ``KeyboardInterrupt`` (armed by the test)."""

    interrupt_next = False

    def append(self, child_id: str, events: Any, **options: Any) -> Any:
        if self.interrupt_next:
            self.interrupt_next = False
            raise KeyboardInterrupt
        return super().append(child_id, events, **options)


def test_a_commit_interrupted_in_one_thread_fails_every_receipt_of_its_batch(
    sqlite_url: str,
) -> None:
    store = _InterruptingStore(sqlite_url)
    try:
        store.create_child(ChildMeta(child_id="c1", parent_session="p", depth=1, seed_length=0))
        transcript = ActivationTranscript(store, "c1", turn=1)
        transcript.publish([])
        source = MessageSource(kind="coordinator")
        first = transcript.steer(lambda: None, text("a"), source, task_id="t1")
        second = transcript.steer(lambda: None, text("b"), source, task_id="t1")
        store.interrupt_next = True

        with pytest.raises(KeyboardInterrupt):
            first.commit()
        with raises(ErrorCode.DURABILITY_FAILED):  # before the fix: returned, as if written
            second.commit()
        with raises(ErrorCode.DURABILITY_FAILED):
            first.commit()
        assert store.load("c1").events == []
    finally:
        store.close()


# -- 5. coded errors, and the real parent never misled -------------------------------------------


def test_a_supervisor_that_cannot_be_created_is_a_coded_error_and_leaves_nothing(
    control: SubagentControl, parent: AgentHandle, fail_thread_start: Callable[[str], None]
) -> None:
    fail_thread_start("ChildSupervisor")
    with raises(ErrorCode.INTERNAL, match="nothing was started"):
        start_child(control, parent)
    assert control.tasks.list(parent) == []
    assert control.children(parent) == []

    child = idle_child(control, parent)
    # A child with no supervisor in this process (passivated, or after a restart).
    assert control.store is not None
    fresh = SubagentControl.open(control.store.url, passivate_after_s=None)
    try:
        fresh.providers.register(FakeProvider())
        again = fresh.agents.register(parent.session_id, model=PARENT_MODEL)
        fail_thread_start("ChildSupervisor")
        with raises(ErrorCode.INTERNAL, match="not delivered"):
            fresh.send_message(again, child, text("lost?"))
        assert inbound(fresh.store.load(child).events, "lost?") == []  # type: ignore[union-attr]
        # Only the child's first Task, from the other runtime (Tasks are in the store).
        assert [t.label for t in fresh.tasks.list(again)] == ["research X"]
    finally:
        fresh.close(timeout_s=5.0)


class _GatedLoadStore(SqlStore):
    """A real store whose loads wait, while armed, until the test opens the gate."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.loading = threading.Event()
        self.gate = threading.Event()

    def load(self, child_id: str) -> Any:
        if self.armed:
            self.loading.set()
            assert self.gate.wait(WAIT_S)
        return super().load(child_id)


@pytest.fixture
def gated(sqlite_url: str, provider: FakeProvider) -> Iterator[SubagentControl]:
    with gated_control(_GatedLoadStore(sqlite_url), provider) as control:
        yield control


def test_the_real_parent_is_not_told_task_not_found_while_a_foreign_resume_loads(
    gated: SubagentControl,
) -> None:
    parent = gated.agents.register("parent-1", model=PARENT_MODEL)
    stranger = gated.agents.register("parent-2", model=PARENT_MODEL)
    child = idle_child(gated, parent)
    store = gated.store
    assert isinstance(store, _GatedLoadStore)
    store.armed = True

    foreign = gated.send_message(stranger, child, text("hijack"))
    assert store.loading.wait(WAIT_S)
    # Before the fix: TASK_NOT_FOUND ("has no task for this session"), which tells the
    # parent model its child has no task for it.
    with raises(ErrorCode.NOT_DELIVERED, match="retry after it settles"):
        gated.send_message(parent, child, text("mine"))
    store.armed = False
    store.gate.set()

    refused = settle(gated, foreign.task_id, stranger)
    assert refused.outcome is not None
    assert refused.outcome.code is ErrorCode.UNAUTHORIZED
    retry = gated.send_message(parent, child, text("mine"))
    assert retry.route == "started"
    assert settle(gated, retry.task_id, parent).status is TaskStatus.COMPLETED
    assert len(inbound(store.load(child).events, "mine")) == 1
    assert inbound(store.load(child).events, "hijack") == []


def test_a_stranger_still_gets_task_not_found_from_a_running_activation(
    control: SubagentControl,
    parent: AgentHandle,
    stranger: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    child, _task, _plan = running_child(control, parent, provider, hold)
    with raises(ErrorCode.TASK_NOT_FOUND):
        control.send_message(stranger, child, text("peek"))


# -- 7. after close, no Task is running ----------------------------------------------------------


def test_close_past_its_timeout_leaves_every_task_terminal(
    make_control: MakeControl, provider: FakeProvider, hold: threading.Event
) -> None:
    control = make_control()
    parent = control.agents.register("parent-1", model=PARENT_MODEL)
    stuck = threading.Event()  # dispose never finishes until the test ends
    child, task_id, plan = running_child(control, parent, provider, hold, dispose_gate=stuck)
    try:
        control.close(timeout_s=0.2)

        snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert snapshot.status is TaskStatus.KILLED
        assert snapshot.outcome is not None
        assert "closed before the run stopped" in (snapshot.outcome.detail or "")
        assert control.tasks.get(task_id, requester=parent).status is TaskStatus.KILLED
    finally:
        stuck.set()
    assert plan.disposed.wait(WAIT_S)
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.KILLED
    assert child


# -- the cap on live activations ------------------------------------------------------------------


def test_starts_and_resumes_past_the_cap_are_refused_with_capacity_writing_nothing(
    make_control: MakeControl, provider: FakeProvider, hold: threading.Event
) -> None:
    control = make_control(max_live_activations=2)
    parent = control.agents.register("parent-1", model=PARENT_MODEL)
    idle = idle_child(control, parent)
    before = events(control, idle)
    running = [running_child(control, parent, provider, hold) for _ in range(2)]

    with raises(ErrorCode.CAPACITY, match="max_live_activations=2"):
        start_child(control, parent)
    with raises(ErrorCode.CAPACITY):
        control.send_message(parent, idle, text("wake"))

    assert len(control.tasks.list(parent)) == 3  # the idle child's first, and the two
    assert events(control, idle) == before
    assert control.store is not None
    assert len(control.store.list_children(parent.session_id)) == 3
    hold.set()
    for _child, task_id, _plan in running:
        settle(control, task_id, parent)
    assert control.send_message(parent, idle, text("wake")).route == "started"


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "10"])
def test_a_bad_cap_is_refused(make_control: MakeControl, cap: object) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="max_live_activations"):
        make_control(max_live_activations=cap)


# -- logging --------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", ["controlplane", "actors", "persistence"])
def test_each_package_logger_has_a_null_handler(package: str) -> None:
    __import__(package)
    handlers = logging.getLogger(package).handlers
    assert any(isinstance(handler, logging.NullHandler) for handler in handlers)


# -- the store's options through open() ------------------------------------------------------------


def test_open_hands_the_store_its_own_options(sqlite_url: str) -> None:
    with SubagentControl.open(
        sqlite_url, durable_os_crash=True, lock_timeout_s=2.0, pause_gc_on_load=True
    ) as control:
        assert control.store is not None
    with raises(ErrorCode.INVALID_INPUT, match="lock_timeout_s"):
        SubagentControl.open(sqlite_url, lock_timeout_s=-1)
