"""An actor that parks (`actors._parking`) holds no thread while its mailbox is empty, yet
handles its messages as pykka's loop does: one at a time, in order, ``on_start`` once; and
when no thread can run it, what was queued is answered "not delivered", never lost."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors._parking import ParkingActor, ask_here
from actors._pool import LoopPool
from controlplane import ErrorCode, SubagentControlError
from tests.support import WAIT_S, eventually

_counters: dict[str, _Counter] = {}
"""Every counter of the running test by URN."""


@pytest.fixture(autouse=True)
def _forget_counters() -> Iterator[None]:
    yield
    _counters.clear()


class _Counter(ParkingActor):
    """Records what it handled, and how many handlers ever ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.starts = 0
        self.handled: list[tuple[int, int]] = []
        self.running = 0
        self.most_at_once = 0
        self.threads: set[threading.Thread] = set()
        _counters[self.actor_urn] = self

    def on_start(self) -> None:
        self.starts += 1

    def on_receive(self, message: Any) -> Any:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.threads.add(threading.current_thread())
        self.handled.append(message)
        self.running -= 1
        return message


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopPool]:
    own = LoopPool(max_idle=4, idle_s=WAIT_S)
    monkeypatch.setattr("actors._base.pool_for", lambda *, daemon: own)
    monkeypatch.setattr("actors._parking.pool_for", lambda *, daemon: own)
    yield own
    own.drain()


def _loop_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{name}-")]


def test_a_parked_actor_holds_no_thread_and_its_next_message_resumes_it(pool: LoopPool) -> None:
    ref = _Counter.start()
    assert ref.ask((0, 0), timeout=WAIT_S) == (0, 0)

    # Its worker goes back to the pool: no thread runs its loop.
    eventually(lambda: not _loop_threads("_Counter"), "the actor parked")
    assert pool.wait_idle(1, WAIT_S)

    assert ref.ask((0, 1), timeout=WAIT_S) == (0, 1)
    actor = _counters[ref.actor_urn]
    assert actor.starts == 1  # resumed, not started again
    ref.stop(timeout=WAIT_S)
    assert actor.handled == [(0, 0), (0, 1)]


def test_messages_from_many_threads_are_handled_one_at_a_time_in_each_senders_order(
    pool: LoopPool,
) -> None:
    ref = _Counter.start()
    senders, each = 4, 300
    barrier = threading.Barrier(senders)

    def send(sender: int) -> None:
        barrier.wait(WAIT_S)
        for k in range(each):
            if k % 3 == 0:
                ref.ask((sender, k), timeout=WAIT_S)  # waits: the actor parks in between
            else:
                ref.tell((sender, k))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    actor = _counters[ref.actor_urn]
    ref.stop(timeout=WAIT_S)

    assert actor.most_at_once == 1
    assert actor.starts == 1
    assert len(actor.handled) == senders * each
    for sender in range(senders):
        mine = [k for s, k in actor.handled if s == sender]
        assert mine == list(range(each))


def test_when_no_thread_can_resume_it_what_was_queued_is_not_delivered_and_it_lives_on(
    pool: LoopPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _Counter.start()
    assert ref.ask((0, 0), timeout=WAIT_S) == (0, 0)
    eventually(lambda: not _loop_threads("_Counter"), "the actor parked")
    real_run = pool.run

    def no_thread(loop: Any, name: str) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(pool, "run", no_thread)
    future = ref.ask((0, 1), block=False)
    with pytest.raises(SubagentControlError) as raised:
        future.get(timeout=WAIT_S)
    assert raised.value.code is ErrorCode.INTERNAL
    assert "not delivered" in str(raised.value)

    monkeypatch.setattr(pool, "run", real_run)
    assert ref.ask((0, 2), timeout=WAIT_S) == (0, 2)
    actor = _counters[ref.actor_urn]
    ref.stop(timeout=WAIT_S)
    assert actor.handled == [(0, 0), (0, 2)]  # the refused message was never handled


class _Gated(_Counter):
    """``"hold"`` waits for ``gate``; every message records the thread that handled it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.on: dict[Any, threading.Thread] = {}
        self.named: dict[Any, str] = {}

    def on_receive(self, message: Any) -> Any:
        self.on[message] = threading.current_thread()
        self.named[message] = threading.current_thread().name
        if message == "hold":
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        return message


def _ask_from_a_thread(ref: Any, message: Any) -> tuple[threading.Thread, Any]:
    asked: list[Any] = []

    def ask() -> None:
        future = ask_here(ref, message)
        asked.append(future.get(timeout=WAIT_S))

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, asked


@pytest.mark.parametrize("at_most", [1, 2])
def test_ask_here_runs_a_parked_actor_on_the_askers_thread_then_hands_the_rest_to_a_worker(
    pool: LoopPool, monkeypatch: pytest.MonkeyPatch, at_most: int
) -> None:
    monkeypatch.setattr("actors._parking.HERE_AT_MOST", at_most)
    monkeypatch.setattr("actors._parking.HOT_S", 0.0)  # however recently it parked
    ref = _Gated.start()
    assert ref.ask("warm", timeout=WAIT_S) == "warm"
    eventually(lambda: not _loop_threads("_Gated"), "the actor parked")
    actor = _counters[ref.actor_urn]

    asker, asked = _ask_from_a_thread(ref, "hold")
    assert actor.entered.wait(WAIT_S)
    # Queued while the asker's thread runs the actor.
    behind = [ref.ask(name, block=False) for name in ("second", "third")]
    actor.gate.set()
    asker.join(WAIT_S)

    assert asked == ["hold"]
    assert actor.on["hold"] is asker
    assert [future.get(timeout=WAIT_S) for future in behind] == ["second", "third"]
    # The asker's share is `HERE_AT_MOST` messages, its own first; a worker takes the rest.
    assert (actor.on["second"] is asker) == (at_most == 2)
    assert actor.on["third"] is not asker
    assert actor.named["third"].startswith("_Gated-")
    ref.stop(timeout=WAIT_S)


def test_ask_here_to_a_hot_actor_hands_the_message_to_a_worker(
    pool: LoopPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hot: parked less than HOT_S ago (here, any actor): its senders' messages gather
    # during a worker's wake-up instead of being handled one sender after another.
    monkeypatch.setattr("actors._parking.HOT_S", 3600.0)
    ref = _Gated.start()
    assert ref.ask("warm", timeout=WAIT_S) == "warm"
    eventually(lambda: not _loop_threads("_Gated"), "the actor parked")

    asker, asked = _ask_from_a_thread(ref, "hot")
    asker.join(WAIT_S)

    assert asked == ["hot"]
    actor = _counters[ref.actor_urn]
    assert actor.on["hot"] is not asker
    assert actor.named["hot"].startswith("_Gated-")
    ref.stop(timeout=WAIT_S)


def test_ask_here_on_the_main_thread_hands_the_message_to_a_worker(pool: LoopPool) -> None:
    assert threading.current_thread() is threading.main_thread()
    ref = _Gated.start()
    assert ref.ask("warm", timeout=WAIT_S) == "warm"
    eventually(lambda: not _loop_threads("_Gated"), "the actor parked")

    assert ask_here(ref, "main").get(timeout=WAIT_S) == "main"

    assert _counters[ref.actor_urn].on["main"] is not threading.main_thread()
    ref.stop(timeout=WAIT_S)


def test_ask_here_to_a_running_actor_queues_like_any_ask(pool: LoopPool) -> None:
    ref = _Gated.start()
    actor = _counters[ref.actor_urn]
    ref.tell("hold")
    assert actor.entered.wait(WAIT_S)

    asker, asked = _ask_from_a_thread(ref, "queued")
    actor.gate.set()
    asker.join(WAIT_S)

    assert actor.on["queued"] is not asker
    assert asked == ["queued"]
    ref.stop(timeout=WAIT_S)
