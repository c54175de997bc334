"""InProcessProvider driven directly: what the model sees, what is written, what a run returns."""

from __future__ import annotations

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControlError,
    SubagentProvider,
    SubagentRun,
    TextBlock,
)
from controlplane.contract import CancelSignal
from controlplane.models import (
    ChatMessage,
    ModelReply,
)

from .conftest import loop_threads
from .fakes import (
    PARENT_MODEL,
    UNREPORTED,
    USER,
    FakeTranscript,
    Parent,
    Runs,
    Written,
    descriptor,
    start_request,
)

TIMEOUT_S = 5.0


def test_inprocess_provider_is_a_subagent_provider_named_inprocess() -> None:
    provider = InProcessProvider(ScriptedModel())
    assert isinstance(provider, SubagentProvider)
    assert provider.name == "inprocess"
    assert InProcessProvider(ScriptedModel(), name="other").name == "other"


def test_start_returns_a_run_before_the_model_answers(runs: Runs) -> None:
    model = ScriptedModel(["done"], gated=True)
    transcript = FakeTranscript()
    run = runs.start(model, transcript)
    assert isinstance(run, SubagentRun)
    assert model.wait_for_calls(1, TIMEOUT_S)
    assert transcript.written == []
    model.release()
    assert run.result().stop_reason == "completed"


def test_a_completed_turn_returns_the_reply_and_writes_it_as_the_only_event(runs: Runs) -> None:
    transcript = FakeTranscript()
    provider = InProcessProvider(ScriptedModel(["the answer"]))
    run = runs.add(provider.start(start_request(Parent(), transcript), CancelSignal()))
    result = run.result()
    assert result.stop_reason == "completed"
    assert result.output == [TextBlock(text="the answer")]
    assert transcript.written == [
        Written(
            EventKind.ASSISTANT_MESSAGE,
            {"text": "the answer", "steering_seen": 0, **UNREPORTED},
            None,
        )
    ]


def test_the_model_sees_the_persona_the_prompt_the_selector_and_the_tool_filter(
    runs: Runs,
) -> None:
    model = ScriptedModel(["ok"])
    desc = descriptor(
        persona="You are a careful researcher.",
        agent_provider="anthropic",
        agent_model="claude",
        tool_filter={"allow": ["read"], "deny": ["write"]},
    )
    request = start_request(Parent(), FakeTranscript(), prompt="research X", desc=desc)
    runs.add(InProcessProvider(model).start(request, CancelSignal())).result()
    (call,) = model.calls
    assert call.system == "You are a careful researcher."
    assert call.messages == [ChatMessage(role="user", text="research X", source=USER)]
    assert call.model == ModelSelector(provider="anthropic", model="claude")
    assert call.tool_filter == {"allow": ["read"], "deny": ["write"]}


def test_a_prompt_of_several_blocks_reaches_the_model_as_one_message(runs: Runs) -> None:
    model = ScriptedModel(["ok"])
    request = start_request(Parent(), FakeTranscript()).model_copy(
        update={"prompt": [TextBlock(text="part one, "), TextBlock(text="part two")]}
    )
    runs.add(InProcessProvider(model).start(request, CancelSignal())).result()
    assert [m.text for m in model.calls[0].messages] == ["part one, part two"]


@pytest.mark.parametrize(
    "fields",
    [{}, {"agent_provider": "only-provider"}, {"agent_model": "only-model"}],
)
def test_without_a_full_selector_in_the_descriptor_the_model_gets_the_parents(
    runs: Runs, fields: dict[str, str]
) -> None:
    model = ScriptedModel(["ok"])
    request = start_request(Parent(), FakeTranscript(), desc=descriptor(**fields))
    runs.add(InProcessProvider(model).start(request, CancelSignal())).result()
    assert model.calls[0].model == PARENT_MODEL


def test_start_registers_the_child_agent_one_level_below_its_parent(runs: Runs) -> None:
    model = ScriptedModel(["ok"], gated=True)
    parent = Parent(depth=1)
    request = start_request(
        parent, FakeTranscript(), desc=descriptor(agent_provider="p", agent_model="m")
    )
    run = runs.add(InProcessProvider(model).start(request, CancelSignal()))
    agent = parent.registry.get(request.child_id)
    assert agent is not None
    assert run.local_agent is agent
    assert agent.depth == 2
    assert agent.model == ModelSelector(provider="p", model="m")
    model.release()
    run.result()
    # The agent lives until the run is disposed, not merely until the turn ends.
    assert agent.is_live
    run.dispose()
    assert not agent.is_live
    assert parent.registry.get(request.child_id) is None


def test_start_refuses_a_child_whose_agent_is_already_live_and_starts_nothing() -> None:
    model = ScriptedModel(["never"])
    parent = Parent()
    request = start_request(parent, FakeTranscript())
    squatter = parent.registry.register(request.child_id)
    with pytest.raises(SubagentControlError) as caught:
        InProcessProvider(model).start(request, CancelSignal())
    assert caught.value.code is ErrorCode.OWNERSHIP_CONFLICT
    assert model.call_count == 0
    assert loop_threads() == []
    assert parent.registry.get(request.child_id) is squatter


def test_the_output_is_the_last_non_empty_reply_when_a_truncated_reply_ends_the_turn(
    runs: Runs,
) -> None:
    model = ScriptedModel(["the answer", ModelReply(text="", stop_reason="max-tokens")], gated=True)
    transcript = FakeTranscript()
    run = runs.start(model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "one more thing")
    model.release(2)
    result = run.result()
    assert result.stop_reason == "max-tokens"
    assert result.output == [TextBlock(text="the answer")]
    assert transcript.texts(EventKind.ASSISTANT_MESSAGE) == ["the answer", ""]


def test_an_empty_final_reply_of_a_completed_turn_does_not_erase_the_output(runs: Runs) -> None:
    model = ScriptedModel(["the answer", ""], gated=True)
    transcript = FakeTranscript()
    run = runs.start(model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "anything else?")
    model.release(2)
    result = run.result()
    assert result.stop_reason == "completed"
    assert result.output == [TextBlock(text="the answer")]


def test_a_turn_with_only_empty_replies_has_no_output(runs: Runs) -> None:
    run = runs.start(ScriptedModel([""]))
    assert run.result().output == []


@pytest.mark.parametrize("reason", ["max-tokens", "refusal", "provider-specific"])
def test_a_stop_reason_other_than_completed_ends_the_turn_with_that_reason(
    runs: Runs, reason: str
) -> None:
    model = ScriptedModel([ModelReply(text="partial", stop_reason=reason), "unreached"])
    transcript = FakeTranscript()
    run = runs.start(model, transcript)
    result = run.result()
    assert result.stop_reason == reason
    assert result.output == [TextBlock(text="partial")]
    assert model.call_count == 1


def test_a_model_error_makes_result_raise_it_and_writes_nothing(runs: Runs) -> None:
    boom = RuntimeError("model overloaded; try later")
    transcript = FakeTranscript()
    run = runs.start(ScriptedModel([boom]), transcript)
    with pytest.raises(RuntimeError) as caught:
        run.result()
    assert caught.value is boom
    with pytest.raises(RuntimeError):
        run.result()  # every call reports the same failure
    assert transcript.written == []


def test_a_model_error_after_a_first_reply_keeps_that_reply_written(runs: Runs) -> None:
    model = ScriptedModel(["first", RuntimeError("lost connection")], gated=True)
    transcript = FakeTranscript()
    run = runs.start(model, transcript)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "go on")
    model.release(2)
    with pytest.raises(RuntimeError, match="lost connection"):
        run.result()
    assert transcript.texts(EventKind.ASSISTANT_MESSAGE) == ["first"]


def test_a_transcript_failure_makes_result_raise_it(runs: Runs) -> None:
    failure = SubagentControlError(ErrorCode.DURABILITY_FAILED, "store down after retries")
    transcript = FakeTranscript(fail_with=failure)
    run = runs.start(ScriptedModel(["ok"]), transcript)
    with pytest.raises(SubagentControlError) as caught:
        run.result()
    assert caught.value is failure


def test_children_of_one_provider_run_concurrently_on_one_model(runs: Runs) -> None:
    model = ScriptedModel(["ok"], gated=True)
    provider = InProcessProvider(model)
    parent = Parent()
    started = [
        runs.add(provider.start(start_request(parent, FakeTranscript()), CancelSignal()))
        for _ in range(3)
    ]
    # All three are inside a model call at once: each child has its own thread.
    assert model.wait_for_calls(3, TIMEOUT_S)
    assert len(loop_threads()) == 3
    model.release(3)
    assert [run.result().stop_reason for run in started] == ["completed"] * 3
