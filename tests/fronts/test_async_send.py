"""A send awaited on an event loop (`controlplane.runtime._asend`, what the fronts steer
with): no worker thread waits on the child's supervisor, and every promise of the
synchronous `send_message` holds — ``steered`` only once durable, exactly once or
``NOT_DELIVERED``, coded refusals, and a cancelled await that neither loses nor duplicates
the message. Real stores, both backends."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pykka
import pytest

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    ScriptedModel,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.runtime._asend import _Answer, running_here, send_async
from controlplane.tools import ToolHandlers

WAIT_S = 30.0


@dataclass
class Rig:
    control: SubagentControl
    model: ScriptedModel
    parent: AgentHandle

    def start(self) -> tuple[str, str]:
        """A published child whose first turn waits in its (gated) model call; its id and
        its running Task."""
        before = self.model.call_count
        started = self.control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label="research X",
                prompt=[TextBlock(text="go")],
                parent=self.parent,
            )
        )
        assert self.model.wait_for_calls(before + 1, WAIT_S)
        # A steer answers once published and durable: the child's header is stored from here.
        warm = self.control.send_message(self.parent, started.child_id, "warm up")
        assert (warm.route, warm.task_id) == ("steered", started.task_id)
        return started.child_id, started.task_id

    def copies(self, child_id: str, text: str) -> int:
        """How many of the child's stored records carry ``text``."""
        assert self.control.store is not None
        events = self.control.store.load(child_id).events
        return sum(text in event.model_dump_json() for event in events)


@pytest.fixture
def rig(store_url: str) -> Iterator[Rig]:
    control = SubagentControl.open(store_url)
    model = ScriptedModel(["the answer"] * 20, gated=True)
    control.providers.register(InProcessProvider(model))
    parent = control.agents.register("async-send")
    yield Rig(control, model, parent)
    model.release(100)
    control.close(timeout_s=10.0)


class HeldPool(ThreadPoolExecutor):
    """A pool whose jobs wait for `let_go`; `submitted` is set at the first submission (the
    supervisor's thread handing on the steer's commit)."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = threading.Event()
        self.gate = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def held() -> Any:
            self.gate.wait(WAIT_S)
            return fn(*args, **kwargs)

        future = super().submit(held)
        self.submitted.set()
        return future

    def let_go(self) -> None:
        self.gate.set()
        self.shutdown(wait=True)  # every held job has run to its end


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=4 * WAIT_S))


def test_a_steer_is_steered_once_durable_and_in_the_transcript_once(rig: Rig) -> None:
    child_id, task_id = rig.start()

    async def scenario() -> None:
        sent = await send_async(rig.control, rig.parent, child_id, "keep seq gapless")
        assert (sent.route, sent.task_id) == ("steered", task_id)
        assert rig.copies(child_id, "keep seq gapless") == 1  # durable before the answer
        snapshot = running_here(rig.control, task_id, rig.parent)
        assert snapshot is not None
        assert snapshot.status is TaskStatus.RUNNING

    run(scenario)


def test_the_tools_steer_takes_no_worker_thread_to_the_supervisor(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the tools know the child as the parent's, a steer never goes through
    `run_blocking` (the worker-thread hop every call took)."""
    child_id, task_id = rig.start()
    tools = ToolHandlers(rig.control, rig.parent)
    arguments = {"subagent_id": child_id, "message": "also the index"}

    async def scenario() -> None:
        first = await tools.acall("send_message", arguments)  # reads the child's header
        assert first.text == f"message delivered to running task {task_id}"

        async def no_hop(*args: object, **kwargs: object) -> object:
            raise AssertionError("a steer of a known child took a worker-thread hop")

        monkeypatch.setattr(AsyncSubagentControl, "run_blocking", no_hop)
        again = await tools.acall("send_message", arguments)
        assert again.text == f"message delivered to running task {task_id}"

    run(scenario)
    assert rig.copies(child_id, "also the index") == 2


def test_a_send_to_an_idle_child_with_a_supervisor_starts_its_next_task(rig: Rig) -> None:
    child_id, task_id = rig.start()
    rig.model.release(2)  # the turn's call, and the one its steered warm-up asks for
    rig.control.tasks.wait(task_id, WAIT_S, requester=rig.parent)

    async def scenario() -> None:
        sent = await send_async(rig.control, rig.parent, child_id, "and now the tests")
        assert sent.route == "started"
        assert sent.task_id != task_id
        assert rig.control.tasks.get(sent.task_id, requester=rig.parent).child_id == child_id

    run(scenario)


def test_a_cancelled_await_still_delivers_the_message_exactly_once(rig: Rig) -> None:
    child_id, task_id = rig.start()
    pool = HeldPool()

    async def scenario() -> None:
        send = asyncio.ensure_future(
            send_async(rig.control, rig.parent, child_id, "the cancelled one", executor=pool)
        )
        # The supervisor answered ``steered`` and handed the commit on: cancel now.
        assert await asyncio.to_thread(pool.submitted.wait, WAIT_S)
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send

    run(scenario)
    assert rig.copies(child_id, "the cancelled one") == 0  # not committed yet
    pool.let_go()
    assert rig.copies(child_id, "the cancelled one") == 1  # the send finished, once
    assert rig.control.tasks.get(task_id, requester=rig.parent).status is TaskStatus.RUNNING


def test_a_steer_its_task_ends_before_is_not_delivered(rig: Rig) -> None:
    child_id, task_id = rig.start()
    pool = HeldPool()

    async def scenario() -> None:
        send = asyncio.ensure_future(
            send_async(rig.control, rig.parent, child_id, "too late", executor=pool)
        )
        assert await asyncio.to_thread(pool.submitted.wait, WAIT_S)
        await asyncio.to_thread(rig.control.tasks.kill, task_id, requester=rig.parent)
        await asyncio.to_thread(pool.let_go)
        with pytest.raises(SubagentControlError) as refused:
            await send
        assert refused.value.code is ErrorCode.NOT_DELIVERED

    run(scenario)
    assert rig.copies(child_id, "too late") == 0


def test_a_refusal_keeps_its_code(rig: Rig) -> None:
    child_id, _task_id = rig.start()
    stranger = rig.control.agents.register("someone-else")

    with pytest.raises(SubagentControlError) as synchronous:
        rig.control.send_message(stranger, child_id, "not mine")

    async def scenario() -> None:
        with pytest.raises(SubagentControlError) as refused:
            await send_async(rig.control, stranger, child_id, "not mine")
        assert refused.value.code is synchronous.value.code is ErrorCode.TASK_NOT_FOUND
        with pytest.raises(SubagentControlError) as blank:
            await send_async(rig.control, rig.parent, child_id, "   ")
        assert blank.value.code is ErrorCode.INVALID_INPUT

    run(scenario)
    assert rig.copies(child_id, "not mine") == 0


def test_a_send_after_close_is_refused_closed(rig: Rig) -> None:
    child_id, _task_id = rig.start()
    tools = ToolHandlers(rig.control, rig.parent)
    rig.model.release(100)
    rig.control.close(timeout_s=10.0)

    async def scenario() -> None:
        with pytest.raises(SubagentControlError) as refused:
            await send_async(rig.control, rig.parent, child_id, "after close")
        assert refused.value.code is ErrorCode.CLOSED
        result = await tools.acall("send_message", {"subagent_id": child_id, "message": "x"})
        assert result.code == ErrorCode.CLOSED

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda a: a.set(None), id="retired-without-handling"),
        pytest.param(
            lambda a: a.set_exception((pykka.ActorDeadError, pykka.ActorDeadError("gone"), None)),
            id="stopped-first",
        ),
    ],
)
def test_an_answer_that_says_delivered_nowhere_routes_the_send_again(
    answer: Callable[[Any], None],
) -> None:
    """As `Router.send` does after a supervisor that never handled the message: sending it
    again cannot duplicate it. The second routing runs in the pool, not on the loop."""
    routed: list[str] = []

    def route_again() -> SendResult:
        routed.append(threading.current_thread().name)
        return SendResult(route="started", task_id="t-2")

    async def scenario() -> SendResult:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[SendResult] = loop.create_future()
        with ThreadPoolExecutor(thread_name_prefix="again") as pool:
            pending = _Answer(loop, outcome, pool, route_again)
            answer(pending)
            with pytest.raises(queue.Full):  # answered once, as pykka's futures are
                pending.set(None)
            return await outcome

    assert run(scenario) == SendResult(route="started", task_id="t-2")
    assert [name.startswith("again") for name in routed] == [True]


def test_a_failure_inside_the_actors_is_internal_and_not_routed_again() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[SendResult] = loop.create_future()
        with ThreadPoolExecutor() as pool:
            pending = _Answer(loop, outcome, pool, lambda: pytest.fail("routed again"))
            pending.set_exception((RuntimeError, RuntimeError("boom"), None))
            with pytest.raises(SubagentControlError) as failed:
                await outcome
        assert failed.value.code is ErrorCode.INTERNAL
        assert "the message was not delivered" in failed.value.message

    run(scenario)


class RefusingPool(ThreadPoolExecutor):
    """An executor that refuses every job (as a user's executor might)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        raise ValueError("no more jobs")


def test_a_commit_that_cannot_be_handed_on_is_internal_and_the_supervisor_lives_on(
    rig: Rig,
) -> None:
    child_id, task_id = rig.start()

    async def scenario() -> None:
        with pytest.raises(SubagentControlError) as failed:
            await send_async(rig.control, rig.parent, child_id, "stranded", executor=RefusingPool())
        assert failed.value.code is ErrorCode.INTERNAL
        assert "transcript" in failed.value.message

    run(scenario)
    # The supervisor still answers; the next sender's drain writes the stranded one too.
    sent = rig.control.send_message(rig.parent, child_id, "after it")
    assert (sent.route, sent.task_id) == ("steered", task_id)
    assert rig.copies(child_id, "stranded") == 1
    assert rig.copies(child_id, "after it") == 1
