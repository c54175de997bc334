"""Kill and dispose at each phase of a run: nothing left running, nothing half-written."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControlError,
    TextBlock,
)
from controlplane.contract import AgentRegistry, CancelSignal
from controlplane.models import (
    ModelReply,
    ModelRequest,
)
from controlplane.providers._loop_threads import IDLE_NAME

from .conftest import loop_threads
from .fakes import (
    FakeTranscript,
    Parent,
    Runs,
    aborted_signal,
    events,
    new_child_id,
    resume_request,
    start_request,
)

TIMEOUT_S = 5.0


class AbortingRegistry(AgentRegistry):
    """A registry whose registration of the child aborts the activation (a kill mid-start)."""

    def __init__(self, signal: CancelSignal, child_id: str) -> None:
        super().__init__()
        self._signal = signal
        self._child_id = child_id

    def register(
        self, session_id: str, model: ModelSelector | None = None, depth: int = 0
    ) -> AgentHandle:
        handle = super().register(session_id, model=model, depth=depth)
        if session_id == self._child_id:
            self._signal.abort("killed while starting")
        return handle


class KillingModel:
    """A model that aborts the activation during its call, then answers or fails anyway."""

    def __init__(self, activation: CancelSignal, *, fail: bool) -> None:
        self._activation = activation
        self._fail = fail

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        self._activation.abort("killed mid-call")
        if self._fail:
            raise RuntimeError("connection reset by the abort")
        return ModelReply(text="an answer nobody waits for")


class StubbornModel:
    """A model that ignores cancellation: it returns only when the test lets it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.leave = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        self.entered.set()
        self.leave.wait(TIMEOUT_S)
        return ModelReply(text="finally")


def test_start_with_an_aborted_signal_raises_cancelled_and_leaves_nothing() -> None:
    model = ScriptedModel(["never"])
    parent = Parent()
    transcript = FakeTranscript()
    request = start_request(parent, transcript)
    with pytest.raises(SubagentControlError) as caught:
        InProcessProvider(model).start(request, aborted_signal())
    assert caught.value.code is ErrorCode.CANCELLED
    assert parent.registry.get(request.child_id) is None
    assert model.call_count == 0
    assert transcript.written == []
    assert loop_threads() == []


def test_resume_with_an_aborted_signal_raises_cancelled_and_leaves_nothing() -> None:
    model = ScriptedModel(["never"])
    parent = Parent()
    transcript = FakeTranscript(turn=2)
    request = resume_request(parent, transcript, child_id=new_child_id(), events=[])
    with pytest.raises(SubagentControlError) as caught:
        InProcessProvider(model).resume(request, aborted_signal())
    assert caught.value.code is ErrorCode.CANCELLED
    assert parent.registry.get(request.child_id) is None
    assert model.call_count == 0
    assert transcript.written == []


def test_an_abort_while_start_is_running_rolls_back_to_quiescence_before_raising() -> None:
    model = ScriptedModel(["never"])
    signal = CancelSignal()
    child_id = new_child_id()
    parent = Parent(registry=AbortingRegistry(signal, child_id))
    transcript = FakeTranscript()
    with pytest.raises(SubagentControlError) as caught:
        InProcessProvider(model).start(start_request(parent, transcript, child_id=child_id), signal)
    assert caught.value.code is ErrorCode.CANCELLED
    assert "killed while starting" in caught.value.message
    # Rolled back: the agent registered during start is gone, no thread ever ran.
    assert parent.registry.get(child_id) is None
    assert loop_threads() == []
    assert model.call_count == 0
    assert transcript.written == []


def test_a_kill_during_a_model_call_ends_the_turn_aborted_without_writing(runs: Runs) -> None:
    model = ScriptedModel(["never"], gated=True)
    signal = CancelSignal()
    transcript = FakeTranscript()
    parent = Parent()
    request = start_request(parent, transcript)
    run = runs.add(InProcessProvider(model).start(request, signal))
    assert model.wait_for_calls(1, TIMEOUT_S)
    signal.abort("killed by the parent")
    result = run.result()
    assert result.stop_reason == "aborted"
    assert result.output == []
    assert transcript.written == []
    # The turn is over but the run is not disposed yet: the agent stays until dispose.
    assert parent.registry.get(request.child_id) is run.local_agent
    run.dispose()
    assert parent.registry.get(request.child_id) is None


def test_a_kill_after_a_first_reply_keeps_it_as_the_output_of_the_aborted_turn(
    runs: Runs,
) -> None:
    model = ScriptedModel(["first", "never"], gated=True)
    signal = CancelSignal()
    transcript = FakeTranscript()
    run = runs.start(model, transcript, signal)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "go on")
    model.release()
    assert model.wait_for_calls(2, TIMEOUT_S)
    signal.abort("killed")
    result = run.result()
    assert result.stop_reason == "aborted"
    assert result.output == [TextBlock(text="first")]
    assert transcript.texts(EventKind.ASSISTANT_MESSAGE) == ["first"]


def test_a_reply_that_arrives_after_the_kill_is_not_written(runs: Runs) -> None:
    signal = CancelSignal()
    transcript = FakeTranscript()
    provider = InProcessProvider(KillingModel(signal, fail=False))
    run = runs.add(provider.start(start_request(Parent(), transcript), signal))
    assert run.result().stop_reason == "aborted"
    assert transcript.written == []


def test_a_model_error_caused_by_the_kill_reports_aborted_not_the_error(runs: Runs) -> None:
    signal = CancelSignal()
    provider = InProcessProvider(KillingModel(signal, fail=True))
    run = runs.add(provider.start(start_request(Parent(), FakeTranscript()), signal))
    assert run.result().stop_reason == "aborted"


def test_a_kill_after_the_turn_settled_changes_nothing(runs: Runs) -> None:
    signal = CancelSignal()
    transcript = FakeTranscript()
    run = runs.start(ScriptedModel(["done"]), transcript, signal)
    before = run.result()
    signal.abort("late kill")
    assert run.result() == before
    assert before.stop_reason == "completed"
    run.dispose()
    assert transcript.texts(EventKind.ASSISTANT_MESSAGE) == ["done"]


def test_dispose_during_a_model_call_stops_the_loop_and_joins_its_thread(runs: Runs) -> None:
    model = ScriptedModel(["never"], gated=True)
    transcript = FakeTranscript()
    request = start_request(Parent(), transcript)
    run = runs.add(InProcessProvider(model).start(request, CancelSignal()))
    assert model.wait_for_calls(1, TIMEOUT_S)
    (thread,) = loop_threads()
    assert thread.name == f"subagent-loop:inprocess:{request.child_id}"
    assert thread.daemon is True
    run.dispose()
    # Its loop has returned: the thread, reused for later loops, no longer bears its name.
    assert thread.name == IDLE_NAME or not thread.is_alive()
    assert loop_threads() == []
    assert run.result().stop_reason == "aborted"
    assert transcript.written == []


def test_dispose_is_idempotent(runs: Runs) -> None:
    parent = Parent()
    request = start_request(parent, FakeTranscript())
    run = runs.add(InProcessProvider(ScriptedModel(["ok"])).start(request, CancelSignal()))
    run.result()
    run.dispose()
    run.dispose()
    assert parent.registry.get(request.child_id) is None
    assert run.result().stop_reason == "completed"


def test_dispose_does_not_dispose_a_later_agent_of_the_same_child(runs: Runs) -> None:
    # After the first run is disposed, a resumed run registers the child again; disposing
    # the old run a second time must leave the new agent alone.
    parent = Parent()
    provider = InProcessProvider(ScriptedModel(["ok"]))
    request = start_request(parent, FakeTranscript())
    old = runs.add(provider.start(request, CancelSignal()))
    old.result()
    old.dispose()
    again = resume_request(parent, FakeTranscript(turn=2), child_id=request.child_id, events=[])
    new = runs.add(provider.resume(again, CancelSignal()))
    old.dispose()
    assert parent.registry.get(request.child_id) is new.local_agent
    new.result()


def test_dispose_gives_up_on_a_model_that_ignores_cancellation_and_says_so(runs: Runs) -> None:
    model = StubbornModel()
    parent = Parent()
    request = start_request(parent, FakeTranscript())
    run = InProcessProvider(model, stop_timeout_s=0.05).start(request, CancelSignal())
    assert model.entered.wait(TIMEOUT_S)
    (thread,) = loop_threads()
    with pytest.raises(SubagentControlError) as caught:
        run.dispose()
    assert caught.value.code is ErrorCode.TIMEOUT
    assert "ignores cancellation" in caught.value.message
    # The agent is released anyway, so the child can be resumed once the model lets go.
    assert parent.registry.get(request.child_id) is None
    model.leave.set()
    run.dispose()
    assert thread.name == IDLE_NAME or not thread.is_alive()
    assert run.result().stop_reason == "aborted"


def test_many_runs_disposed_mid_call_leave_no_thread(runs: Runs) -> None:
    model = ScriptedModel(["never"], gated=True)
    provider = InProcessProvider(model)
    parent = Parent()
    started = [
        runs.add(provider.start(start_request(parent, FakeTranscript()), CancelSignal()))
        for _ in range(20)
    ]
    assert model.wait_for_calls(20, TIMEOUT_S)
    for run in started:
        run.dispose()
    assert loop_threads() == []
    assert parent.registry.live() == [parent.handle]


def test_a_resumed_run_is_killed_like_a_started_one(runs: Runs) -> None:
    model = ScriptedModel(["never"], gated=True)
    signal = CancelSignal()
    request = resume_request(
        Parent(),
        FakeTranscript(turn=2),
        child_id=new_child_id(),
        events=events((EventKind.USER_MESSAGE, {"text": "earlier"})),
    )
    run = runs.add(InProcessProvider(model).resume(request, signal))
    assert model.wait_for_calls(1, TIMEOUT_S)
    signal.abort("killed")
    assert run.result().stop_reason == "aborted"
