"""SPEC §5 send_message 4-5 under races: threads released together by a barrier, many times.

Each scenario asserts the invariants, never one lucky ordering:
- at most one activation per child at any instant (the fake counts live runs per child);
- every message is either in the child's transcript exactly once, with its source, and its
  caller got ``steered``/``started``, or its caller got a raise (``NOT_DELIVERED``, or
  ``CLOSED``/``UNAUTHORIZED`` where the race allows it) and it is nowhere in the transcript.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pykka
import pytest

from controlplane import (
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    MessageSource,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
)
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import (
    WAIT_S,
    MakeControl,
    carrying,
    events,
    idle_child,
    in_thread,
    settle,
    start_child,
    text,
    wait_published,
)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def rounds(url: str) -> int:
    """Interleavings per scenario (fewer on PostgreSQL, where each round costs more I/O)."""
    return 100 if url.startswith("sqlite") else 30


def race(*actions: Callable[[], Any], jitter_s: float = 400e-6) -> list[Any]:
    """Run ``actions`` in threads released together; their results or exceptions, in order.

    After the barrier all but one thread (chosen at random) pause for a random moment up to
    ``jitter_s``. This is not synchronisation: the barrier releases the last thread to arrive
    first and the GIL keeps it running, so without the pause one ordering would dominate.
    """
    barrier = threading.Barrier(len(actions))
    first = random.randrange(len(actions))

    def released(i: int, action: Callable[[], Any]) -> Callable[[], Any]:
        pause_s = 0.0 if i == first else random.uniform(0.0, jitter_s)

        def body() -> Any:
            barrier.wait(WAIT_S)
            if pause_s:
                time.sleep(pause_s)
            return action()

        return body

    futures = [in_thread(released(i, action)) for i, action in enumerate(actions)]
    outcomes: list[Any] = []
    for future in futures:
        try:
            outcomes.append(future.result(WAIT_S))
        except SubagentControlError as exc:
            outcomes.append(exc)
    return outcomes


def coordinator(parent: AgentHandle) -> MessageSource:
    return MessageSource(kind="coordinator", sender_session_id=parent.session_id)


def assert_in_transcript_once(
    control: SubagentControl, child_id: str, message: str, source: MessageSource
) -> None:
    found = carrying(events(control, child_id), message)
    assert len(found) == 1, f"{message!r} stored {len(found)} times"
    assert found[0].kind in (EventKind.STEERING_MESSAGE, EventKind.USER_MESSAGE)
    assert found[0].source == source


def assert_nowhere(control: SubagentControl, child_id: str, message: str) -> None:
    assert carrying(events(control, child_id), message) == []


def test_send_racing_publication_is_steered_exactly_once(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    for i in range(rounds):
        gate, release = threading.Event(), threading.Event()
        plan = provider.plan(start_gate=gate, result_gate=release)
        started = start_child(control, parent)
        assert plan.entered.wait(WAIT_S)
        message = f"racing publication {i}"

        send = partial(control.send_message, parent, started.child_id, text(message))
        _, sent = race(gate.set, send)

        assert isinstance(sent, SendResult), sent
        assert (sent.route, sent.task_id) == ("steered", started.task_id)
        assert provider.steered_texts(started.child_id) == [message]
        assert_in_transcript_once(control, started.child_id, message, coordinator(parent))
        release.set()
        assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
        assert provider.max_live[started.child_id] == 1


def test_send_racing_settlement_is_steered_started_or_not_delivered_never_lost(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    routes: dict[str, int] = {}
    for i in range(rounds):
        release = threading.Event()
        plan = provider.plan(result_gate=release)
        started = start_child(control, parent)
        assert plan.returned.wait(WAIT_S)
        message = f"racing settlement {i}"

        send = partial(control.send_message, parent, started.child_id, text(message))
        _, sent = race(release.set, send)

        settle(control, started.task_id, parent)
        if isinstance(sent, SubagentControlError):
            assert sent.code is ErrorCode.NOT_DELIVERED, sent
            routes["not-delivered"] = routes.get("not-delivered", 0) + 1
            assert_nowhere(control, started.child_id, message)
            assert provider.steered_texts(started.child_id) == []
        else:
            routes[sent.route] = routes.get(sent.route, 0) + 1
            if sent.route == "steered":
                assert sent.task_id == started.task_id
                assert provider.steered_texts(started.child_id) == [message]
            else:
                assert sent.task_id != started.task_id
                settle(control, sent.task_id, parent)
            assert_in_transcript_once(control, started.child_id, message, coordinator(parent))
        assert provider.max_live[started.child_id] == 1
    assert sum(routes.values()) == rounds


def test_two_sends_into_an_idle_child_start_one_activation(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    child_id = idle_child(control, parent)
    human = MessageSource(kind="human")
    for i in range(rounds):
        release = threading.Event()
        provider.plan(result_gate=release, for_child=child_id)
        a, b = f"from the coordinator {i}", f"from a human {i}"

        sent_a, sent_b = race(
            partial(control.send_message, parent, child_id, text(a)),
            partial(control.send_message, parent, child_id, text(b), human),
        )

        assert isinstance(sent_a, SendResult), sent_a
        assert isinstance(sent_b, SendResult), sent_b
        assert sorted([sent_a.route, sent_b.route]) == ["started", "steered"]
        assert sent_a.task_id == sent_b.task_id
        release.set()
        assert settle(control, sent_a.task_id, parent).status is TaskStatus.COMPLETED
        assert_in_transcript_once(control, child_id, a, coordinator(parent))
        assert_in_transcript_once(control, child_id, b, human)
        assert provider.max_live[child_id] == 1


def test_kill_racing_the_load_never_leaves_a_run_behind(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    child_id = idle_child(control, parent)
    killed_before_provider = 0
    for _ in range(rounds):
        calls_before = len(provider.plans)
        # The turn never ends on its own: only the kill can settle it.
        provider.default_plan(result_gate=threading.Event())
        sent = control.send_message(parent, child_id, text("carry on"))
        control.tasks.kill(sent.task_id, requester=parent)

        snapshot = settle(control, sent.task_id, parent)

        assert snapshot.status is TaskStatus.KILLED
        calls = provider.plans[calls_before:]
        assert len(calls) <= 1
        if not calls:
            killed_before_provider += 1
        else:
            assert calls[0].rolled_back.is_set() or calls[0].disposed.is_set()
        assert provider.total_live() == 0
        assert provider.max_live.get(child_id, 0) <= 1


def test_owner_disposal_racing_a_follow_up_leaves_no_task_running(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, rounds: int
) -> None:
    child_id = idle_child(control, parent)
    parent.dispose()
    for i in range(rounds):
        owner = control.agents.register(parent.session_id)
        provider.default_plan(result_gate=threading.Event())
        message = f"last words {i}"

        send = partial(control.send_message, owner, child_id, text(message))
        sent, _ = race(send, owner.dispose)

        if isinstance(sent, SubagentControlError):
            assert sent.code in (ErrorCode.UNAUTHORIZED, ErrorCode.NOT_DELIVERED), sent
            assert_nowhere(control, child_id, message)
        else:
            assert sent.route == "started"
            snapshot = settle(control, sent.task_id, parent.session_id)
            assert snapshot.status in (TaskStatus.KILLED, TaskStatus.FAILED), snapshot
        assert provider.total_live() == 0
        assert provider.max_live.get(child_id, 0) <= 1


def test_close_racing_a_start_settles_or_refuses_it(
    make_control: MakeControl, provider: FakeProvider, rounds: int
) -> None:
    for i in range(max(rounds // 3, 10)):
        control = make_control()
        parent = control.agents.register("parent-1")
        settled: list[TaskSnapshot] = []
        control.tasks.on_done(settled.append)
        if i % 2:
            provider.default_plan(start_gate=threading.Event())
        else:
            provider.default_plan(result_gate=threading.Event())

        spec = ContinuableStartSpec(provider="fake", label="bg", prompt=text("go"), parent=parent)
        started, _ = race(partial(control.start_continuable, spec), control.close)

        assert control.closed
        if isinstance(started, SubagentControlError):
            assert started.code is ErrorCode.CLOSED, started
            assert settled == []
        else:
            assert isinstance(started, ContinuableStart)
            assert [(s.id, s.status) for s in settled] == [(started.task_id, TaskStatus.KILLED)]
        assert provider.total_live() == 0
        assert pykka.ActorRegistry.get_all() == []


def test_owner_disposal_racing_a_start_leaves_no_task_running(
    control: SubagentControl, provider: FakeProvider, rounds: int
) -> None:
    provider.default_plan(result_gate=threading.Event())
    for _ in range(rounds):
        owner = control.agents.register("parent-1")
        spec = ContinuableStartSpec(provider="fake", label="bg", prompt=text("go"), parent=owner)

        started, _ = race(partial(control.start_continuable, spec), owner.dispose)

        if isinstance(started, SubagentControlError):
            assert started.code is ErrorCode.UNAUTHORIZED, started
        else:
            snapshot = settle(control, started.task_id, "parent-1")
            assert snapshot.status is TaskStatus.KILLED, snapshot
        assert provider.total_live() == 0
        assert all(s.status.is_terminal for s in control.tasks.list("parent-1"))


@pytest.mark.slow  # measured: 4 s under load (--durations)
def test_send_racing_close_is_steered_and_stored_or_refused_and_nowhere(
    make_control: MakeControl, url: str, provider: FakeProvider, rounds: int
) -> None:
    for i in range(max(rounds // 3, 10)):
        control = make_control()
        parent = control.agents.register("parent-1")
        plan = provider.plan(result_gate=threading.Event())
        started = start_child(control, parent)
        wait_published(control, started.child_id)
        message = f"racing close {i}"
        send = partial(control.send_message, parent, started.child_id, text(message))

        sent, _ = race(send, control.close)

        assert plan.disposed.is_set()
        with SqlStore(url) as store:  # the closed control plane closed its own
            found = carrying(store.load(started.child_id).events, message)
        if isinstance(sent, SubagentControlError):
            assert sent.code in (ErrorCode.CLOSED, ErrorCode.NOT_DELIVERED), sent
            assert found == []
            assert provider.steered_texts(started.child_id) == []
        else:
            assert (sent.route, sent.task_id) == ("steered", started.task_id)
            assert len(found) == 1
        assert provider.total_live() == 0
        assert pykka.ActorRegistry.get_all() == []
