"""A resumed child's model sees its earlier tool exchanges, rebuilt the way the API wants them."""

from __future__ import annotations

from typing import Any

from controlplane import (
    CancelSignal,
    ChildTool,
    EventKind,
    InProcessProvider,
    ScriptedModel,
)
from controlplane.models import (
    ChatMessage,
    ToolCall,
)
from controlplane.providers._agent_loop import chat_history
from controlplane.providers._chat_history import INTERRUPTED_TOOL_CALL

from .fakes import (
    COORDINATOR,
    HUMAN,
    USER,
    FakeTranscript,
    Parent,
    Runs,
    descriptor,
    events,
    new_child_id,
    resume_request,
)


def call(id_: str, name: str = "add", arguments: Any = None) -> tuple[str, dict[str, Any]]:
    return ("tool/call", {"id": id_, "name": name, "arguments": arguments or {"a": 1}})


def result(id_: str, **outcome: str) -> tuple[str, dict[str, Any]]:
    return ("tool/result", {"id": id_, **outcome})


def test_tool_calls_rebuild_as_an_assistant_message_with_calls_then_one_tool_message_each() -> None:
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "sum it"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": "let me add"}),
            call("c1"),
            result("c1", output="1"),
            call("c2", "div", {"a": 1, "b": 0}),
            result("c2", error="ZeroDivisionError: division by zero"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "1, and no quotient"}),
        )
    )
    assert history == [
        ChatMessage(role="user", text="sum it", source=USER),
        ChatMessage(
            role="assistant",
            text="let me add",
            tool_calls=[
                ToolCall(id="c1", name="add", arguments='{"a": 1}'),
                ToolCall(id="c2", name="div", arguments='{"a": 1, "b": 0}'),
            ],
        ),
        ChatMessage(role="tool", text="1", tool_call_id="c1"),
        ChatMessage(
            role="tool", text="error: ZeroDivisionError: division by zero", tool_call_id="c2"
        ),
        ChatMessage(role="assistant", text="1, and no quotient"),
    ]


def test_arguments_that_were_not_json_are_replayed_as_the_model_wrote_them() -> None:
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1", arguments='{"a": 1,'),
            result("c1", error="the arguments are not valid JSON"),
        )
    )
    assert history[0].tool_calls == [ToolCall(id="c1", name="add", arguments='{"a": 1,')]


def test_a_message_that_arrived_while_tools_ran_follows_the_results() -> None:
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            (EventKind.STEERING_MESSAGE, {"text": "hurry"}, HUMAN),
            result("c1", output="1"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "done"}),
        )
    )
    assert [(m.role, m.text) for m in history] == [
        ("assistant", ""),
        ("tool", "1"),
        ("user", "hurry"),
        ("assistant", "done"),
    ]


def test_a_message_that_arrived_between_two_calls_of_one_reply_follows_all_their_results() -> None:
    # The loop writes each call just before it runs it, so a steer can land between two
    # calls of one reply; the model read it after both results, at its next call.
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 0}),
            call("c1"),
            result("c1", output="1"),
            (EventKind.STEERING_MESSAGE, {"text": "hurry"}, HUMAN),
            call("c2"),
            result("c2", output="2"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "done", "steering_seen": 1}),
        )
    )
    assert [(m.role, m.text, [c.id for c in m.tool_calls]) for m in history] == [
        ("assistant", "", ["c1", "c2"]),
        ("tool", "1", []),
        ("tool", "2", []),
        ("user", "hurry", []),
        ("assistant", "done", []),
    ]


def test_a_message_no_reply_read_before_the_turn_ended_closes_that_turn() -> None:
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "task"}, USER),
            (EventKind.STEERING_MESSAGE, {"text": "late"}, HUMAN),
            (EventKind.ASSISTANT_MESSAGE, {"text": "answer", "steering_seen": 0}),
            (EventKind.TURN_END, {"status": "killed"}),
        )
    )
    assert [(m.role, m.text) for m in history] == [
        ("user", "task"),
        ("assistant", "answer"),
        ("user", "late"),
    ]


def test_a_seed_of_two_turns_without_frames_places_each_turns_steering_by_its_own_count() -> None:
    # A fork's seed: a parent's history copied as turn 0, here without its frames; each
    # turn's prompt (user/message) starts its count of steering messages again.
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "one"}, USER),
            (EventKind.STEERING_MESSAGE, {"text": "a"}, HUMAN),
            (EventKind.ASSISTANT_MESSAGE, {"text": "r1", "steering_seen": 0}),
            (EventKind.ASSISTANT_MESSAGE, {"text": "r2", "steering_seen": 1}),
            (EventKind.USER_MESSAGE, {"text": "two"}, USER),
            (EventKind.STEERING_MESSAGE, {"text": "b"}, HUMAN),
            (EventKind.ASSISTANT_MESSAGE, {"text": "r3", "steering_seen": 0}),
            (EventKind.ASSISTANT_MESSAGE, {"text": "r4", "steering_seen": 1}),
        )
    )
    assert [m.text for m in history] == ["one", "r1", "a", "r2", "two", "r3", "b", "r4"]


def test_a_call_without_a_result_is_answered_as_interrupted() -> None:
    # The turn was killed (or the process died) while the tool ran.
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            (EventKind.TURN_END, {"status": "killed"}),
            (EventKind.USER_MESSAGE, {"text": "try again"}, COORDINATOR),
        )
    )
    assert [(m.role, m.text, m.tool_call_id) for m in history] == [
        ("assistant", "", None),
        ("tool", f"error: {INTERRUPTED_TOOL_CALL}", "c1"),
        ("user", "try again", None),
    ]


def test_a_result_without_its_call_and_a_call_without_an_id_are_skipped() -> None:
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": "hi"}),
            ("tool/call", {"name": "add"}),
            result("nobody", output="stray"),
        )
    )
    assert history == [ChatMessage(role="assistant", text="hi")]


def test_a_resumed_childs_model_sees_its_earlier_tool_calls_and_results(runs: Runs) -> None:
    earlier = events(
        (EventKind.TURN_START, {"turn": 1}),
        (EventKind.USER_MESSAGE, {"text": "2+3?"}, USER),
        (EventKind.DESCRIPTOR, {"version": 1, "provider": "inprocess"}),
        (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
        call("c1", arguments={"a": 2, "b": 3}),
        result("c1", output="5"),
        (EventKind.ASSISTANT_MESSAGE, {"text": "5"}),
        (EventKind.TURN_END, {"status": "completed"}),
    )
    model = ScriptedModel(["still 5"])
    request = resume_request(
        Parent(), FakeTranscript(), child_id=new_child_id(), events=earlier, prompt="sure?"
    )
    runs.add(InProcessProvider(model).resume(request, CancelSignal())).result()

    assert [(m.role, m.text, m.tool_call_id) for m in model.calls[0].messages] == [
        ("user", "2+3?", None),
        ("assistant", "", None),
        ("tool", "5", "c1"),
        ("assistant", "5", None),
        ("user", "sure?", None),
    ]
    assert model.calls[0].messages[1].tool_calls[0].arguments == '{"a": 2, "b": 3}'


def test_the_tool_filter_still_applies_after_a_resume(runs: Runs) -> None:
    tools = [
        ChildTool("read", "x", {}, lambda args: "r"),
        ChildTool("write", "x", {}, lambda args: "w"),
    ]
    model = ScriptedModel(["ok"])
    request = resume_request(
        Parent(),
        FakeTranscript(),
        child_id=new_child_id(),
        events=[],
        desc=descriptor(tool_filter={"deny": ["write"]}),
    )
    runs.add(InProcessProvider(model, tools=tools).resume(request, CancelSignal())).result()
    assert [t.name for t in model.calls[0].tools] == ["read"]
