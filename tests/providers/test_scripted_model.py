"""ScriptedModel: the deterministic model adapter the demo and the tests drive children with."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest

from controlplane import (
    CancelSignal,
    ErrorCode,
    ModelSelector,
    ScriptedModel,
    SubagentControlError,
)
from controlplane.models import (
    ChatMessage,
    ModelAdapter,
    ModelReply,
    ModelRequest,
)

TIMEOUT_S = 5.0


def ask(text: str, *, system: str | None = None) -> ModelRequest:
    return ModelRequest(system=system, messages=[ChatMessage(role="user", text=text)])


def aborted_mid_call(model: ScriptedModel) -> SubagentControlError:
    """Abort a call once ``model`` is inside it; what the call raised."""
    signal = CancelSignal()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(model.complete, ask("q"), signal)
        assert model.wait_for_calls(1, TIMEOUT_S)
        signal.abort("killed")
        with pytest.raises(SubagentControlError) as caught:
            future.result(TIMEOUT_S)
    return caught.value


def test_scripted_model_is_a_model_adapter() -> None:
    assert isinstance(ScriptedModel(["x"]), ModelAdapter)


def test_replies_are_served_in_order_then_the_last_one_repeats() -> None:
    model = ScriptedModel(["one", "two"])
    texts = [model.complete(ask("q"), CancelSignal()).text for _ in range(4)]
    assert texts == ["one", "two", "two", "two"]


def test_with_echo_the_model_echoes_the_last_user_message_once_replies_run_out() -> None:
    model = ScriptedModel(["scripted"], echo=True)
    signal = CancelSignal()
    first = model.complete(ask("ignored"), signal)
    request = ModelRequest(
        messages=[
            ChatMessage(role="user", text="older"),
            ChatMessage(role="user", text="latest"),
            ChatMessage(role="assistant", text="not me"),
        ]
    )
    assert first.text == "scripted"
    assert model.complete(request, signal).text == "echo: latest"


def test_a_model_without_replies_echoes() -> None:
    model = ScriptedModel()
    assert model.complete(ask("hello"), CancelSignal()).text == "echo: hello"
    assert model.complete(ModelRequest(messages=[]), CancelSignal()).text == "echo: "


def test_a_model_reply_entry_keeps_its_stop_reason() -> None:
    model = ScriptedModel([ModelReply(text="cut", stop_reason="max-tokens")])
    reply = model.complete(ask("q"), CancelSignal())
    assert reply == ModelReply(text="cut", stop_reason="max-tokens")
    assert ModelReply(text="plain").stop_reason == "completed"


def test_an_exception_entry_is_raised_by_its_call_only() -> None:
    boom = RuntimeError("model overloaded")
    model = ScriptedModel(["fine", boom, "recovered"])
    assert model.complete(ask("q"), CancelSignal()).text == "fine"
    with pytest.raises(RuntimeError) as caught:
        model.complete(ask("q"), CancelSignal())
    assert caught.value is boom
    assert model.complete(ask("q"), CancelSignal()).text == "recovered"


def test_every_served_call_is_recorded_with_its_system_prompt_and_messages() -> None:
    model = ScriptedModel(["a"])
    selector = ModelSelector(provider="p", model="m")
    request = ModelRequest(
        system="you are terse", messages=[ChatMessage(role="user", text="q")], model=selector
    )
    model.complete(request, CancelSignal())
    model.complete(ask("second"), CancelSignal())
    calls = model.calls
    assert calls[0] == request
    assert [c.messages[-1].text for c in calls] == ["q", "second"]
    assert model.call_count == 2


def test_calls_returns_a_copy_the_caller_cannot_corrupt() -> None:
    model = ScriptedModel(["a"])
    model.complete(ask("q"), CancelSignal())
    model.calls.clear()
    assert len(model.calls) == 1


def test_a_gated_call_blocks_until_released() -> None:
    model = ScriptedModel(["through"], gated=True)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(model.complete, ask("q"), CancelSignal())
        assert model.wait_for_calls(1, TIMEOUT_S)
        # Only release() can let it through, so it is still pending here.
        assert not future.done()
        model.release()
        assert future.result(TIMEOUT_S).text == "through"


def test_a_release_before_the_call_lets_it_through_at_once() -> None:
    model = ScriptedModel(["a", "b"], gated=True)
    model.release(2)
    signal = CancelSignal()
    assert [model.complete(ask("q"), signal).text for _ in range(2)] == ["a", "b"]


def test_one_release_lets_exactly_one_gated_call_through() -> None:
    model = ScriptedModel(["a", "b"], gated=True)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(model.complete, ask("1"), CancelSignal())
        second = pool.submit(model.complete, ask("2"), CancelSignal())
        assert model.wait_for_calls(2, TIMEOUT_S)
        model.release()
        done, pending = wait([first, second], TIMEOUT_S, return_when=FIRST_COMPLETED)
        assert len(done) == 1
        # One permit, so the other call cannot have passed the gate.
        assert not pending.pop().done()
        model.release()
        assert {first.result(TIMEOUT_S).text, second.result(TIMEOUT_S).text} == {"a", "b"}


def test_aborting_the_signal_ends_a_gated_call_with_cancelled() -> None:
    error = aborted_mid_call(ScriptedModel(["never"], gated=True))

    assert error.code is ErrorCode.CANCELLED
    assert "killed" in error.message


def test_a_call_with_an_already_aborted_signal_is_cancelled_but_recorded() -> None:
    model = ScriptedModel(["never"], gated=True)
    signal = CancelSignal()
    signal.abort("gone")
    with pytest.raises(SubagentControlError) as caught:
        model.complete(ask("q"), signal)
    assert caught.value.code is ErrorCode.CANCELLED
    assert model.call_count == 1


def test_an_abort_does_not_consume_a_gate_permit() -> None:
    model = ScriptedModel(["a"], gated=True)
    signal = CancelSignal()
    signal.abort("gone")
    with pytest.raises(SubagentControlError):
        model.complete(ask("q"), signal)
    model.release()
    assert model.complete(ask("q"), CancelSignal()).text == "a"


def test_a_kill_interrupts_the_delay() -> None:
    # A 10-minute delay under the 60 s test timeout: only the abort can end the call.
    error = aborted_mid_call(ScriptedModel(["late"], delay_s=600))

    assert error.code is ErrorCode.CANCELLED


def test_a_delayed_call_replies_after_its_delay() -> None:
    model = ScriptedModel(["slow"], delay_s=0.01)
    assert model.complete(ask("q"), CancelSignal()).text == "slow"


def test_wait_for_calls_returns_false_when_the_calls_never_come() -> None:
    assert ScriptedModel(["a"]).wait_for_calls(1, timeout_s=0.01) is False


@pytest.mark.parametrize("n", [0, -1])
def test_release_refuses_a_count_below_one(n: int) -> None:
    with pytest.raises(SubagentControlError) as caught:
        ScriptedModel(gated=True).release(n)
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(SubagentControlError) as caught:
        ScriptedModel(delay_s=-1)
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_a_long_lived_model_keeps_only_its_latest_requests_but_counts_every_call() -> None:
    model = ScriptedModel(echo=True, keep_calls=3)

    replies = [model.complete(ask(f"q{i}"), CancelSignal()).text for i in range(10)]

    assert replies[-1] == "echo: q9"  # serving is unchanged by what it keeps
    assert model.call_count == 10
    assert model.wait_for_calls(10, TIMEOUT_S)
    assert [request.messages[0].text for request in model.calls] == ["q7", "q8", "q9"]


def test_by_default_a_model_keeps_the_latest_thousand_requests() -> None:
    model = ScriptedModel(["ok"])

    for i in range(1005):
        model.complete(ask(f"q{i}"), CancelSignal())

    kept = model.calls
    assert len(kept) == 1000
    assert kept[0].messages[0].text == "q5"
    assert model.call_count == 1005


@pytest.mark.parametrize("keep", [0, -1, 1.5, True])
def test_keeping_no_requests_is_refused(keep: object) -> None:
    with pytest.raises(SubagentControlError) as caught:
        ScriptedModel(keep_calls=keep)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.INVALID_INPUT
