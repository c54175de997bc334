"""The asyncio front: awaiting never freezes the event loop, and cancelling an await leaves
the control plane as the synchronous call would."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ResumeRequest,
    ScriptedModel,
    StartRequest,
    SubagentControlError,
    SubagentRun,
    TaskStatus,
    TextBlock,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.tools import ToolHandlers

from .conftest import WAIT_S, Rig

T = TypeVar("T")

TICK_S = 0.005
"""The ticker's period."""

GATE_AT_TICK = 20
"""The ticker lets the child's model answer at this tick: if waiting froze the loop, the
tick would never come and the wait would time out."""

MIN_TICK_RATIO = 0.1
"""The fewest ticks, as a share of the ticks an undisturbed loop would make while waiting.
Loose on purpose: a busy two-core machine stretches sleeps, but a frozen loop makes none."""


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run one async scenario in a fresh event loop."""
    return asyncio.run(asyncio.wait_for(scenario(), timeout=4 * WAIT_S))


def spec(rig: Rig, *, provider: str = "inprocess", prompt: str = "go") -> ContinuableStartSpec:
    return ContinuableStartSpec(
        provider=provider, label="research X", prompt=[TextBlock(text=prompt)], parent=rig.parent
    )


def listeners(rig: Rig) -> int:
    # Private on purpose: the one place a leaked completion listener would show.
    return len(rig.control._tasks._listeners)


class Ticker:
    """An asyncio task that counts ticks and releases the gated model at `GATE_AT_TICK`."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.ticks += 1
            if self.ticks == GATE_AT_TICK:
                self.model.release(10)


def assert_loop_kept_ticking(ticker: Ticker, elapsed_s: float) -> None:
    assert ticker.ticks >= GATE_AT_TICK
    expected = elapsed_s / TICK_S
    assert ticker.ticks >= MIN_TICK_RATIO * expected, (ticker.ticks, expected)


# -- the event loop keeps running ---------------------------------------------------------


def test_awaiting_wait_on_a_gated_child_keeps_the_event_loop_ticking(gated: Rig) -> None:
    aio = AsyncSubagentControl(gated.control)

    async def scenario() -> tuple[TaskStatus, Ticker, float]:
        start = await aio.start_continuable(spec(gated))
        loop = asyncio.get_running_loop()
        ticker = Ticker(gated.model)
        began = loop.time()
        ticker.start()
        snapshot = await aio.wait(start.task_id, timeout=2 * WAIT_S, requester=gated.parent)
        elapsed = loop.time() - began
        await ticker.stop()
        return snapshot.status, ticker, elapsed

    status, ticker, elapsed = run(scenario)

    assert status is TaskStatus.COMPLETED
    assert_loop_kept_ticking(ticker, elapsed)


def test_awaiting_task_output_with_wait_keeps_the_event_loop_ticking(gated: Rig) -> None:
    started = gated.start()

    async def scenario() -> tuple[str, Ticker, float]:
        loop = asyncio.get_running_loop()
        ticker = Ticker(gated.model)
        began = loop.time()
        ticker.start()
        result = await gated.tools.acall(
            "task_output", {"task_id": started.task_id, "wait": True, "timeout_s": 2 * WAIT_S}
        )
        elapsed = loop.time() - began
        await ticker.stop()
        assert not result.is_error, result.text
        return result.text, ticker, elapsed

    text, ticker, elapsed = run(scenario)

    assert text == "the answer\n[status: completed]"
    assert_loop_kept_ticking(ticker, elapsed)


# -- wait ---------------------------------------------------------------------------------


def test_a_follow_up_right_after_an_awaited_wait_starts_the_next_activation(rig: Rig) -> None:
    aio = AsyncSubagentControl(rig.control)

    async def scenario() -> str:
        start = await aio.start_continuable(spec(rig))
        await aio.wait(start.task_id, timeout=WAIT_S, requester=rig.parent)
        result = await aio.send_message(rig.parent, start.child_id, [TextBlock(text="more")])
        await aio.wait(result.task_id, timeout=WAIT_S, requester=rig.parent)
        return result.route

    assert run(scenario) == "started"


def test_an_awaited_send_to_an_id_that_is_no_child_is_refused_at_once(rig: Rig) -> None:
    aio = AsyncSubagentControl(rig.control)

    async def scenario() -> ErrorCode:
        with pytest.raises(SubagentControlError) as raised:
            await aio.send_message(rig.parent, str(uuid.uuid4()), [TextBlock(text="hello?")])
        return raised.value.code

    assert run(scenario) is ErrorCode.CHILD_NOT_FOUND
    assert rig.control.tasks.list(rig.parent) == []


def test_an_awaited_wait_that_times_out_raises_timeout_and_the_task_runs_on(gated: Rig) -> None:
    aio = AsyncSubagentControl(gated.control)
    baseline = listeners(gated)

    async def scenario() -> str:
        start = await aio.start_continuable(spec(gated))
        with pytest.raises(SubagentControlError) as raised:
            await aio.wait(start.task_id, timeout=0.05, requester=gated.parent)
        assert raised.value.code is ErrorCode.TIMEOUT
        return start.task_id

    task_id = run(scenario)

    assert listeners(gated) == baseline
    assert gated.control.tasks.get(task_id, requester=gated.parent).status is TaskStatus.RUNNING
    gated.model.release(10)
    assert gated.settle(task_id).status is TaskStatus.COMPLETED


def test_an_awaited_wait_is_fenced_and_checks_its_timeout(rig: Rig) -> None:
    aio = AsyncSubagentControl(rig.control)
    started = rig.start()

    async def scenario() -> list[ErrorCode]:
        codes = []
        for task_id, requester, timeout in [
            ("no-such-task", rig.parent, 1.0),
            (started.task_id, "parent-2", 1.0),
            (started.task_id, rig.parent, -1.0),
            (started.task_id, rig.parent, float("nan")),
        ]:
            with pytest.raises(SubagentControlError) as raised:
                await aio.wait(task_id, timeout=timeout, requester=requester)
            codes.append(raised.value.code)
        return codes

    assert run(scenario) == [
        ErrorCode.TASK_NOT_FOUND,
        ErrorCode.TASK_NOT_FOUND,
        ErrorCode.INVALID_INPUT,
        ErrorCode.INVALID_INPUT,
    ]


def test_a_cancelled_wait_stops_listening_and_leaves_the_task_alone(gated: Rig) -> None:
    aio = AsyncSubagentControl(gated.control)
    baseline = listeners(gated)
    started = gated.start()

    async def scenario() -> None:
        waiting = asyncio.create_task(
            aio.wait(started.task_id, timeout=WAIT_S, requester=gated.parent)
        )
        await asyncio.sleep(0)  # the wait subscribes in its first step
        assert listeners(gated) == baseline + 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    run(scenario)

    assert listeners(gated) == baseline
    assert gated.control.tasks.get(started.task_id, requester=gated.parent).status is (
        TaskStatus.RUNNING
    )
    gated.model.release(10)
    assert gated.settle(started.task_id).status is TaskStatus.COMPLETED


# -- a cancelled call still happens as a whole ----------------------------------------------


class GatedStartProvider:
    """The in-process provider behind a gate: ``start`` blocks until the test opens it
    (watching its signal, as a provider must), so the child stays unpublished."""

    def __init__(self, model: ScriptedModel) -> None:
        self._inner = InProcessProvider(model, name="gated")
        self.entered = threading.Event()
        self.gate = threading.Event()

    @property
    def name(self) -> str:
        return "gated"

    def start(self, request: StartRequest, signal: CancelSignal) -> SubagentRun:
        self.entered.set()
        signal.add_callback(lambda _reason: self.gate.set())
        if not self.gate.wait(2 * WAIT_S):
            raise RuntimeError("the test never opened the start gate")
        signal.raise_if_aborted()
        return self._inner.start(request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> SubagentRun:
        return self._inner.resume(request, signal)


def test_a_cancelled_send_abandons_the_answer_but_the_message_is_delivered(gated: Rig) -> None:
    provider = GatedStartProvider(gated.model)
    gated.control.providers.register(provider)
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-aio")
    aio = AsyncSubagentControl(gated.control, executor=executor)

    async def scenario() -> tuple[str, str]:
        start = await aio.start_continuable(spec(gated, provider="gated"))
        assert await asyncio.to_thread(provider.entered.wait, WAIT_S)
        # Unpublished: the send is held inside the control plane until publication.
        sending = asyncio.create_task(
            aio.send_message(gated.parent, start.child_id, [TextBlock(text="held")])
        )
        await asyncio.sleep(0)  # submitted to the executor in its first step
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        provider.gate.set()
        # Joins the abandoned send: it has returned (or raised) once this does.
        await asyncio.to_thread(executor.shutdown, wait=True)
        return start.child_id, start.task_id

    try:
        child_id, task_id = run(scenario)
    finally:
        provider.gate.set()
        executor.shutdown(wait=True)

    gated.model.release(10)
    assert gated.settle(task_id).status is TaskStatus.COMPLETED
    assert [task.id for task in gated.control.tasks.list(gated.parent)] == [task_id]
    steering = [e for e in gated.events(child_id) if e.kind == EventKind.STEERING_MESSAGE]
    assert [e.data for e in steering] == [{"text": "held"}]


def test_a_cancelled_acall_subagent_still_starts_exactly_one_child(rig: Rig) -> None:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-aio")
    tools = ToolHandlers(rig.control, rig.parent, executor=executor)

    async def scenario() -> None:
        calling = asyncio.create_task(
            tools.acall("subagent", {"description": "research X", "prompt": "go"})
        )
        await asyncio.sleep(0)  # submitted to the executor in its first step
        calling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await calling
        await asyncio.to_thread(executor.shutdown, wait=True)

    try:
        run(scenario)
    finally:
        executor.shutdown(wait=True)

    (task,) = rig.control.tasks.list(rig.parent)
    assert [view.child_id for view in rig.control.children(rig.parent)] == [task.child_id]
    assert rig.settle(task.id).status is TaskStatus.COMPLETED


def test_acall_answers_like_call(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)

    async def scenario() -> list[tuple[str, bool]]:
        answers = []
        for name, arguments in [
            ("task_output", {"task_id": started.task_id}),
            ("list_agents", "{}"),
            ("task_list", {}),
            ("task_output", {"task_id": "nope", "wait": True}),
            ("send_message", {"subagent_id": started.child_id, "message": "  "}),
            ("no_such_tool", {}),
        ]:
            result = await rig.tools.acall(name, arguments)
            answers.append((result.text, result.is_error))
        return answers

    answers = run(scenario)

    assert answers[0] == ("the answer\n[status: completed]", False)
    # SPEC §7's line, then what the child spent (its one model call reported no tokens).
    assert answers[1] == (
        f"{started.child_id} [ready] — research X — 0 tokens, 1 model call",
        False,
    )
    assert answers[2][0].startswith(f"{started.task_id} [completed] — research X")
    assert answers[3][1]
    assert answers[3][0].startswith("error [TASK_NOT_FOUND]: ")
    assert answers[4][1]
    assert answers[4][0].startswith("error [INVALID_INPUT]: ")
    assert answers[5][0].startswith("error [INVALID_INPUT]: there is no tool named")
    assert len(rig.control.tasks.list(rig.parent)) == 1


def test_a_cancelled_acall_wait_leaves_no_listener_behind(gated: Rig) -> None:
    started = gated.start()
    baseline = listeners(gated)

    async def scenario() -> None:
        calling = asyncio.create_task(
            gated.tools.acall("task_output", {"task_id": started.task_id, "wait": True})
        )
        # Parsing runs in a worker; give it a bounded chance to reach the wait.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while listeners(gated) == baseline and loop.time() < deadline:
            await asyncio.sleep(0.001)
        assert listeners(gated) == baseline + 1
        calling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await calling

    run(scenario)

    assert listeners(gated) == baseline
    gated.model.release(10)
    assert gated.settle(started.task_id).status is TaskStatus.COMPLETED
