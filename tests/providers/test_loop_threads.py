"""Agent loops run on reused threads: a turn after another starts on the thread the
first one left, bearing its own loop's name only while it runs."""

from __future__ import annotations

import contextvars
import threading

import pytest

from controlplane import CancelSignal, InProcessProvider
from controlplane.models import ModelReply, ModelRequest
from controlplane.providers._loop_threads import IDLE_NAME, LoopThreads

from .fakes import FakeTranscript, Parent, Runs, start_request

TIMEOUT_S = 10.0
_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="fresh")


class ThreadOfEachCall:
    """A model that answers at once and notes the thread (and its name) it was called on."""

    def __init__(self) -> None:
        self.calls: list[tuple[threading.Thread, str]] = []

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        thread = threading.current_thread()
        self.calls.append((thread, thread.name))
        return ModelReply(text="ok")


def test_a_later_turn_runs_on_the_thread_an_earlier_one_left(runs: Runs) -> None:
    model = ThreadOfEachCall()
    provider = InProcessProvider(model)
    parent = Parent()
    requests = [start_request(parent, FakeTranscript()) for _ in range(2)]
    for request in requests:
        run = runs.add(provider.start(request, CancelSignal()))
        assert run.result().stop_reason == "completed"
        run.dispose()

    (first, first_name), (second, second_name) = model.calls
    assert second is first  # no thread started for the second turn
    assert first_name == f"subagent-loop:inprocess:{requests[0].child_id}"
    assert second_name == f"subagent-loop:inprocess:{requests[1].child_id}"
    assert second.name == IDLE_NAME


def test_each_loop_starts_with_an_empty_context_and_an_idle_thread_times_out() -> None:
    threads = LoopThreads(max_idle=1, idle_s=0.05)
    seen: list[str] = []

    def loop() -> None:
        seen.append(_SEEN.get())
        _SEEN.set("left behind")

    first = threads.start(loop, "one")
    assert first.join(TIMEOUT_S)
    second = threads.start(loop, "two")
    assert second.join(TIMEOUT_S)
    assert second.thread is first.thread
    assert seen == ["fresh", "fresh"]
    first.thread.join(TIMEOUT_S)  # idle past idle_s: it ends
    assert not first.thread.is_alive()
    assert threads.idle() == 0


def test_a_loop_that_raises_ends_its_thread_and_its_handle_says_it_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.thread.name))
    threads = LoopThreads(max_idle=1, idle_s=TIMEOUT_S)

    def loop() -> None:
        raise RuntimeError("the loop failed")

    run = threads.start(loop, "failing")
    assert run.join(TIMEOUT_S)
    run.thread.join(TIMEOUT_S)

    assert not run.running
    assert not run.thread.is_alive()
    assert reported == [IDLE_NAME]  # renamed before the handle was told
    assert threads.idle() == 0
