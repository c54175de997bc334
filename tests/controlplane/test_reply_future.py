"""`actors._base.Reply`, the future every ask to our actors answers on, keeps pykka's
`ThreadingFuture` contract: each scenario runs against both and must come out the same."""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import pykka
import pytest

from actors._base import Actor, Reply

WAIT_S = 10.0

Make = Callable[[], pykka.Future[Any]]
# The contract is pykka's since 4.3 (a value after a get hook refused, a negative timeout a
# timeout): older pykka versions, which pyproject.toml still admits, differ in those corners.
_PYKKA = tuple(int(part) for part in version("pykka").split(".")[:2])
FUTURES = [
    pytest.param(
        pykka.ThreadingFuture,
        id="pykka",
        marks=pytest.mark.skipif(
            _PYKKA < (4, 3), reason=f"pykka {version('pykka')} predates the 4.3 contract"
        ),
    ),
    pytest.param(Reply, id="reply"),
]


@pytest.mark.parametrize("make", FUTURES)
def test_a_value_set_once_is_got_every_time(make: Make) -> None:
    future = make()
    future.set(42)
    assert future.get(timeout=WAIT_S) == 42
    assert future.get() == 42


@pytest.mark.parametrize("make", FUTURES)
@pytest.mark.parametrize("timeout", [0.0, 0.01, -1.0])
def test_a_get_with_nothing_set_times_out_with_pykkas_timeout(make: Make, timeout: float) -> None:
    future = make()
    with pytest.raises(pykka.Timeout, match=f"{timeout} seconds"):
        future.get(timeout=timeout)
    future.set("late")  # a timed-out get leaves the future usable
    assert future.get(timeout=0) == "late"


@pytest.mark.parametrize("make", FUTURES)
def test_an_exception_set_is_raised_by_every_get_with_its_traceback(make: Make) -> None:
    future = make()
    try:
        raise ValueError("boom")
    except ValueError:
        future.set_exception()
        traceback = sys.exc_info()[2]
    for _ in range(2):
        with pytest.raises(ValueError, match="boom") as raised:
            future.get(timeout=WAIT_S)
        assert raised.value.__traceback__ is not None
        assert traceback is not None
        walk: Any = raised.value.__traceback__
        frames = []
        while walk is not None:
            frames.append(walk.tb_frame)
            walk = walk.tb_next
        assert traceback.tb_frame in frames


@pytest.mark.parametrize("make", FUTURES)
def test_an_exception_type_without_a_value_is_raised_as_an_instance(make: Make) -> None:
    future = make()
    future.set_exception((KeyError, None, None))
    with pytest.raises(KeyError):
        future.get(timeout=WAIT_S)


@pytest.mark.parametrize("make", FUTURES)
@pytest.mark.parametrize(
    "second",
    [
        lambda f: f.set(2),
        lambda f: f.set_exception((ValueError, ValueError("x"), None)),
        lambda f: f.set_get_hook(lambda _t: 3),
    ],
    ids=["set", "set_exception", "set_get_hook"],
)
def test_a_future_is_set_once(make: Make, second: Callable[[pykka.Future[Any]], None]) -> None:
    future = make()
    future.set(1)
    with pytest.raises(queue.Full):
        second(future)
    assert future.get(timeout=WAIT_S) == 1


@pytest.mark.parametrize("make", FUTURES)
def test_after_a_get_hook_a_value_is_refused_and_a_hook_replaces_it(make: Make) -> None:
    future = make()
    future.set_get_hook(lambda _t: 1)
    with pytest.raises(queue.Full):
        future.set(2)
    with pytest.raises(queue.Full):
        future.set_exception((ValueError, None, None))
    future.set_get_hook(lambda _t: "second")
    assert future.get(timeout=WAIT_S) == "second"


@pytest.mark.parametrize("make", FUTURES)
def test_a_get_hook_is_called_once_with_the_callers_timeout(make: Make) -> None:
    future = make()
    calls: list[float | None] = []

    def hook(timeout: float | None) -> str:
        calls.append(timeout)
        return "hooked"

    future.set_get_hook(hook)
    assert future.get(timeout=WAIT_S) == "hooked"
    assert future.get() == "hooked"
    assert calls == [WAIT_S]


@pytest.mark.parametrize("make", FUTURES)
def test_map_filter_reduce_and_join_work_through_get_hooks(make: Make) -> None:
    a, b = make(), make()
    mapped = a.map(lambda v: v * 10)
    joined = pykka.Future.join(a, b)
    a.set(2)
    b.set(3)
    assert mapped.get(timeout=WAIT_S) == 20
    assert joined.get(timeout=WAIT_S) == [2, 3]
    many = make()
    many.set([1, 2, 3, 4])
    assert many.filter(lambda v: v % 2 == 0).get(timeout=WAIT_S) == [2, 4]
    assert many.reduce(lambda x, y: x + y).get(timeout=WAIT_S) == 10


@pytest.mark.parametrize("make", FUTURES)
def test_every_waiting_getter_is_woken_by_one_set(make: Make) -> None:
    future = make()
    got: list[Any] = []
    ready = threading.Barrier(4)

    def wait() -> None:
        ready.wait(WAIT_S)
        got.append(future.get(timeout=WAIT_S))

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    ready.wait(WAIT_S)  # the getters are at (or just before) their wait
    future.set("all")
    for thread in threads:
        thread.join(WAIT_S)
    assert got == ["all"] * 3


def test_a_getter_waiting_when_a_get_hook_is_set_gets_the_hooks_value() -> None:
    # Where Reply differs: pykka's waiter keeps waiting (for a value that will never come).
    future: Reply[Any] = Reply()
    got: list[Any] = []
    started = threading.Event()

    def wait() -> None:
        started.set()
        got.append(future.get(timeout=WAIT_S))

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(WAIT_S)
    future.set_get_hook(lambda _timeout: "from the hook")
    thread.join(WAIT_S)
    assert got == ["from the hook"]


@pytest.mark.parametrize("make", FUTURES)
def test_a_future_can_be_awaited(make: Make) -> None:
    future = make()
    future.set("awaited")

    async def main() -> Any:
        return await future

    assert asyncio.run(main()) == "awaited"


class _Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        if message == "fail":
            raise RuntimeError("failed in the actor")
        return message


def test_an_ask_to_our_actors_answers_on_a_reply() -> None:
    ref = _Echo.start()
    try:
        future = ref.ask("hi", block=False)
        assert isinstance(future, Reply)
        assert future.get(timeout=WAIT_S) == "hi"
        with pytest.raises(RuntimeError, match="failed in the actor"):
            ref.ask("fail", timeout=WAIT_S)
        assert ref.proxy().actor_ref.ask("again", timeout=WAIT_S) == "again"
    finally:
        ref.stop(timeout=WAIT_S)
