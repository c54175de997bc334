"""Messages racing a run that parks on an approval request: the child's supervisor holds
each one while the run parks and delivers it once the Task's next step is known (into the
parked Task's continued turn), so every message is delivered exactly once, none is
refused, and the child never has two activations.

Both backends: SQLite in ``tmp_path``, PostgreSQL when its URL is set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import CancelSignal, ResumeRequest, StartRequest, SubagentRun
from controlplane.models import ModelReply, ToolCall
from tests.support import held_messages

WAIT_S = 20.0
SENDERS = 6
EACH = 12

pytestmark = pytest.mark.timeout(120)


class _GatedRun:
    """A run whose first dispose waits for ``gate``: its activation stays parking (the run's
    result in, the Task not yet left) for as long as the test wants."""

    def __init__(self, run: SubagentRun, gate: threading.Event, disposing: threading.Event):
        self._run = run
        self._gate = gate
        self._disposing = disposing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def dispose(self) -> None:
        self._disposing.set()
        assert self._gate.wait(WAIT_S), "the test never opened the gate"
        self._run.dispose()


class _GatedProvider(InProcessProvider):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.disposing = threading.Event()

    def start(self, request: StartRequest, signal: CancelSignal) -> SubagentRun:
        return _GatedRun(super().start(request, signal), self.gate, self.disposing)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> SubagentRun:
        return _GatedRun(super().resume(request, signal), self.gate, self.disposing)


def _deploy() -> ChildTool:
    return ChildTool(
        "deploy",
        "Deploy.",
        {"type": "object", "properties": {"env": {"type": "string"}}},
        lambda arguments: "deployed",
        approval="always",
    )


def _model() -> ScriptedModel:
    return ScriptedModel(
        [ModelReply(text="go", tool_calls=[ToolCall(id="c1", name="deploy", arguments={})]), "ok"]
    )


def _steered_texts(control: SubagentControl, child_id: str) -> list[str]:
    assert control.store is not None
    return [
        event.data["text"]
        for event in control.store.load(child_id).events
        if event.kind == EventKind.STEERING_MESSAGE
    ]


def test_sends_to_a_parking_run_are_held_by_its_supervisor_then_go_into_the_parked_turn(
    store_url: str,
) -> None:
    provider = _GatedProvider(_model(), tools=[_deploy()])
    control = SubagentControl.open(store_url, approval_grace_s=0.001)
    try:
        control.providers.register(provider)
        parent = control.agents.register("p1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="ship", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        child_id, task_id = started.child_id, started.task_id
        waiting = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert waiting.request is not None
        assert provider.disposing.wait(WAIT_S), "the run parked"
        texts = [f"m{n}" for n in range(5)]
        results: dict[str, SendResult | SubagentControlError] = {}

        def send(text: str) -> None:
            try:
                results[text] = control.send_message(
                    parent, child_id, [TextBlock(text=text)], MessageSource(kind="coordinator")
                )
            except SubagentControlError as exc:
                results[text] = exc

        threads = [threading.Thread(target=send, args=(text,)) for text in texts]
        for thread in threads:
            thread.start()
        # The run parked and waits in its dispose: the supervisor holds every message
        # (no refusal, no retry), and the tree shows them.
        deadline = time.monotonic() + WAIT_S
        while held_messages(control, child_id) < len(texts):
            assert time.monotonic() < deadline, "the supervisor never held the messages"
            assert not results, results
            time.sleep(0.01)
        assert not results, results
        provider.gate.set()
        for thread in threads:
            thread.join(timeout=WAIT_S)
        assert {(r.route, r.task_id) for r in results.values()} == {("steered", task_id)}, (  # type: ignore[union-attr]
            results
        )
        control.answer(parent, waiting.request.id, allow=True)
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert sorted(_steered_texts(control, child_id)) == texts
    finally:
        provider.gate.set()
        control.close(timeout_s=10.0)


@pytest.fixture
def control(store_url: str) -> Iterator[SubagentControl]:
    model, deploy = _model(), _deploy()
    # A grace this short parks the run at once, and again after every continuation: the
    # senders below race many parkings, not one.
    opened = SubagentControl.open(store_url, approval_grace_s=0.001)
    opened.providers.register(InProcessProvider(model, tools=[deploy]))
    yield opened
    opened.close(timeout_s=10.0)


def test_sends_racing_a_parking_run_are_each_delivered_once_into_its_task(
    control: SubagentControl,
) -> None:
    parent = control.agents.register("p1")
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="ship", prompt=[TextBlock(text="go")], parent=parent
        )
    )
    child_id, task_id = started.child_id, started.task_id
    waiting = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert waiting.status is TaskStatus.INPUT_REQUIRED
    assert waiting.request is not None

    results: dict[str, SendResult | SubagentControlError] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(SENDERS)

    def sender(n: int) -> None:
        barrier.wait(timeout=WAIT_S)
        for i in range(EACH):
            text = f"m{n}-{i}"
            try:
                result: SendResult | SubagentControlError = control.send_message(
                    parent, child_id, [TextBlock(text=text)], MessageSource(kind="coordinator")
                )
            except SubagentControlError as exc:
                result = exc
            with lock:
                results[text] = result

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S * 3)
    assert not any(thread.is_alive() for thread in threads)

    refused = {text: r for text, r in results.items() if isinstance(r, SubagentControlError)}
    assert not refused, refused
    assert {(r.route, r.task_id) for r in results.values()} == {("steered", task_id)}  # type: ignore[union-attr]

    control.answer(parent, waiting.request.id, allow=True)
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED, done

    steered = _steered_texts(control, child_id)
    assert sorted(steered) == sorted(results), "each message exactly once in the transcript"
    assert control.store is not None
    events = control.store.load(child_id).events
    # One turn, opened once and ended once: the parked Task went on in it every time, and
    # no second activation began a turn of its own.
    assert [e.kind for e in events].count(EventKind.TURN_START) == 1
    assert [e.kind for e in events].count(EventKind.TURN_END) == 1
