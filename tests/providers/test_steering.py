"""Steering a running child: each window of the turn, and the order things are written in."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    ScriptedModel,
    SubagentControlError,
    SubagentResult,
    SubagentRun,
    TextBlock,
)
from controlplane.contract import CancelSignal
from controlplane.models import (
    ChatMessage,
    ModelReply,
    ToolCall,
)
from controlplane.providers._chat_history import chat_history

from .fakes import (
    COORDINATOR,
    HUMAN,
    UNREPORTED,
    USER,
    FakeTranscript,
    Runs,
    Written,
    events,
)

USER_MESSAGE = EventKind.USER_MESSAGE

TIMEOUT_S = 5.0


def launch(runs: Runs, model: ScriptedModel, transcript: FakeTranscript) -> SubagentRun:
    return runs.start(model, transcript, prompt="task")


def assert_not_delivered(run: SubagentRun) -> None:
    assert run.steer is not None
    with pytest.raises(SubagentControlError) as caught:
        run.steer([TextBlock(text="too late")], COORDINATOR)
    assert caught.value.code is ErrorCode.NOT_DELIVERED
    assert "the turn has settled" in caught.value.message


def test_a_message_steered_right_after_start_reaches_the_model_in_the_same_turn(
    runs: Runs,
) -> None:
    model = ScriptedModel(["reply"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    transcript.deliver(run, "also check Y")
    model.release(2)
    assert run.result().stop_reason == "completed"
    # Taken before the first call or before the next one, never dropped.
    assert model.calls[-1].messages[0] == ChatMessage(role="user", text="task", source=USER)
    assert ChatMessage(role="user", text="also check Y", source=COORDINATOR) in (
        model.calls[-1].messages
    )


def test_a_message_steered_during_a_model_call_is_taken_before_the_next_call(
    runs: Runs,
) -> None:
    model = ScriptedModel(["first", "second"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "steer", HUMAN)
    model.release(2)
    result = run.result()
    assert result.output == [TextBlock(text="second")]
    first, second = model.calls
    assert [m.text for m in first.messages] == ["task"]
    assert second.messages == [
        ChatMessage(role="user", text="task", source=USER),
        ChatMessage(role="assistant", text="first"),
        ChatMessage(role="user", text="steer", source=HUMAN),
    ]


def test_messages_steered_during_one_call_are_all_taken_by_the_next_call_in_order(
    runs: Runs,
) -> None:
    model = ScriptedModel(["first", "second"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    for text in ("a", "b", "c"):
        transcript.deliver(run, text)
    model.release(2)
    run.result()
    assert model.call_count == 2
    assert [m.text for m in model.calls[1].messages] == ["task", "first", "a", "b", "c"]


def test_steering_is_recorded_before_the_reply_it_causes(runs: Runs) -> None:
    model = ScriptedModel(["first", "second"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "steer")
    model.release(2)
    run.result()
    # The loop writes replies only; the steering record is the control plane's (here: the
    # fake's), and it lands before the reply that answered it, even before the reply whose
    # call was running when it came: that one says its model had not read it.
    assert transcript.written == [
        Written("steering/message", {"text": "steer"}, COORDINATOR),
        Written(
            EventKind.ASSISTANT_MESSAGE, {"text": "first", "steering_seen": 0, **UNREPORTED}, None
        ),
        Written(
            EventKind.ASSISTANT_MESSAGE, {"text": "second", "steering_seen": 1, **UNREPORTED}, None
        ),
    ]


@pytest.mark.parametrize("replies_before_the_steer", [0, 1, 2])
def test_the_conversation_rebuilt_from_the_transcript_is_the_one_the_model_saw(
    runs: Runs, replies_before_the_steer: int
) -> None:
    # Tool-calling replies keep the turn going, so a steer can land in any call's window.
    calling = ModelReply(text="", tool_calls=[ToolCall(id="c", name="missing")])
    model = ScriptedModel([calling, calling, "last", "after"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    if replies_before_the_steer:
        model.release(replies_before_the_steer)
    assert model.wait_for_calls(replies_before_the_steer + 1, TIMEOUT_S)
    transcript.deliver(run, "steer")
    transcript.deliver(run, "and this")
    model.release(10)
    run.result()

    stored = [(USER_MESSAGE, {"text": "task"}, USER)] + [
        (w.kind, w.data, w.source) for w in transcript.written
    ]
    last_call = model.calls[-1].messages
    assert chat_history(events(*stored))[: len(last_call)] == last_call


def test_a_steer_after_the_turn_ended_is_not_delivered(runs: Runs) -> None:
    model = ScriptedModel(["done"])
    run = launch(runs, model, FakeTranscript())
    run.result()
    assert_not_delivered(run)
    assert model.call_count == 1


def test_a_steer_after_dispose_is_not_delivered(runs: Runs) -> None:
    model = ScriptedModel(["done"], gated=True)
    run = launch(runs, model, FakeTranscript())
    assert model.wait_for_calls(1, TIMEOUT_S)
    run.dispose()
    assert_not_delivered(run)


def test_a_steer_after_the_activation_was_killed_is_not_delivered(runs: Runs) -> None:
    model = ScriptedModel(["done"], gated=True)
    signal = CancelSignal()
    run = runs.start(model, signal=signal)
    assert model.wait_for_calls(1, TIMEOUT_S)
    signal.abort("killed")
    assert_not_delivered(run)


def test_a_steer_after_a_model_error_is_not_delivered(runs: Runs) -> None:
    run = launch(runs, ScriptedModel([RuntimeError("boom")]), FakeTranscript())
    with pytest.raises(RuntimeError):
        run.result()
    assert_not_delivered(run)


def race_a_steer_against_the_end_of_the_turn(
    runs: Runs, model: ScriptedModel, transcript: FakeTranscript
) -> tuple[list[str], list[int], SubagentResult]:
    """Steer "raced" as the gate opens on the turn's first call: what the sender heard, which
    model calls saw the message, and the turn's result."""
    barrier = threading.Barrier(2)
    outcome: list[str] = []

    def steer() -> None:
        barrier.wait(TIMEOUT_S)
        try:
            transcript.deliver(run, "raced")
            outcome.append("accepted")
        except SubagentControlError as exc:
            outcome.append(exc.code)

    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    sender = threading.Thread(target=steer)
    sender.start()
    barrier.wait(TIMEOUT_S)
    model.release(3)
    result = run.result()
    sender.join(TIMEOUT_S)
    seeing = [i for i, c in enumerate(model.calls) if "raced" in [m.text for m in c.messages]]
    return outcome, seeing, result


@pytest.mark.parametrize("round_", range(100))
def test_every_accepted_steer_reaches_the_model_and_is_recorded_before_its_reply(
    runs: Runs, round_: int
) -> None:
    # Race the steer against the end of the turn: either it is refused, or a model call of
    # this turn saw it and its record precedes that call's reply. Both outcomes occur over
    # the rounds.
    model = ScriptedModel(["r1", "r2", "r3"], gated=True)
    transcript = FakeTranscript()
    outcome, seeing, result = race_a_steer_against_the_end_of_the_turn(runs, model, transcript)
    assert result.stop_reason == "completed"
    if outcome == [ErrorCode.NOT_DELIVERED]:
        assert seeing == []
        return
    assert outcome == ["accepted"]
    assert seeing, "an accepted steer never reached the model"
    kinds = [(w.kind, w.data["text"]) for w in transcript.written]
    steer_at = kinds.index(("steering/message", "raced"))
    replies_at = [i for i, (kind, _) in enumerate(kinds) if kind == EventKind.ASSISTANT_MESSAGE]
    assert steer_at < replies_at[seeing[0]]


def test_the_source_of_a_steered_message_reaches_the_model(runs: Runs) -> None:
    model = ScriptedModel(["first", "second"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    human = MessageSource(kind="human", sender_session_id="operator")
    transcript.deliver(run, "from a human", human)
    model.release(2)
    run.result()
    assert model.calls[1].messages[-1].source == human


@pytest.mark.parametrize("reason", ["max-tokens", "refusal", "provider-specific"])
def test_a_steer_taken_during_a_call_that_stops_short_is_seen_by_the_model_in_the_same_turn(
    runs: Runs, reason: str
) -> None:
    # The sender heard `steered` and its record is written: the turn must not end before the
    # model has seen the message, whatever the reply it was waiting on said.
    model = ScriptedModel([ModelReply(text="cut", stop_reason=reason), "seen it"], gated=True)
    transcript = FakeTranscript()
    run = launch(runs, model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "one more thing")
    model.release(2)
    result = run.result()
    assert model.call_count == 2
    assert [m.text for m in model.calls[1].messages] == ["task", "cut", "one more thing"]
    assert result.stop_reason == "completed"
    assert result.output == [TextBlock(text="seen it")]


@pytest.mark.parametrize("round_", range(50))
def test_a_steer_racing_a_turn_that_stops_short_is_either_refused_or_seen_by_the_model(
    runs: Runs, round_: int
) -> None:
    model = ScriptedModel(
        [ModelReply(text="cut", stop_reason="max-tokens"), "seen", "seen again"], gated=True
    )
    outcome, seeing, result = race_a_steer_against_the_end_of_the_turn(
        runs, model, FakeTranscript()
    )
    if outcome == [ErrorCode.NOT_DELIVERED]:
        assert seeing == []
        assert result.stop_reason == "max-tokens"
        return
    assert outcome == ["accepted"]
    assert seeing, "an accepted steer never reached the model"
    assert result.stop_reason == "completed"
