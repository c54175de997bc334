"""Child tools in the in-process loop: what the model is offered, what runs, what is written."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from controlplane import (
    CancelSignal,
    ChildTool,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControlError,
    TextBlock,
)
from controlplane.models import (
    ChatMessage,
    ModelReply,
    ToolCall,
)
from controlplane.providers._child_tools import MAX_TOOL_TEXT_CHARS

from .fakes import (
    ONE_TOOL_CALL,
    UNREPORTED,
    FakeTranscript,
    Parent,
    Runs,
    Written,
    descriptor,
    start_request,
)

TIMEOUT_S = 5.0
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def add_tool() -> ChildTool:
    return ChildTool(
        "add", "Add two integers.", ADD_SCHEMA, lambda args: str(args["a"] + args["b"])
    )


def echo_tool(name: str = "echo") -> ChildTool:
    return ChildTool(name, "Echo the text.", {"type": "object"}, lambda args: f"{name}:{args}")


def calls(*specs: tuple[str, str, Any]) -> ModelReply:
    """A reply calling tools: ``(id, name, arguments)`` each (arguments: a dict or raw text)."""
    return ModelReply(
        tool_calls=[ToolCall(id=i, name=n, arguments=a) for i, n, a in specs],
    )


def results(transcript: FakeTranscript) -> list[dict[str, Any]]:
    return [w.data for w in transcript.written if w.kind == "tool/result"]


def test_a_tool_call_is_run_and_the_model_answers_from_its_result(runs: Runs) -> None:
    model = ScriptedModel([calls(("c1", "add", {"a": 2, "b": 3})), "it is 5"])
    transcript = FakeTranscript()
    run = runs.start(model, transcript, tools=[add_tool()], prompt="2+3?")

    result = run.result()

    assert result.stop_reason == "completed"
    assert result.output == [TextBlock(text="it is 5")]
    assert transcript.written == [
        Written(EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 0, **UNREPORTED}, None),
        Written("tool/call", {"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}, None),
        Written("tool/result", {"id": "c1", "output": "5", **ONE_TOOL_CALL}, None),
        Written(
            EventKind.ASSISTANT_MESSAGE, {"text": "it is 5", "steering_seen": 0, **UNREPORTED}, None
        ),
    ]
    second = model.calls[1].messages
    assert second[1].tool_calls == [ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')]
    assert second[2] == ChatMessage(role="tool", text="5", tool_call_id="c1")


def test_the_model_is_offered_each_tools_definition(runs: Runs) -> None:
    model = ScriptedModel(["no tools needed"])
    runs.start(model, tools=[add_tool(), echo_tool()]).result()

    offered = model.calls[0].tools
    assert [t.name for t in offered] == ["add", "echo"]
    assert offered[0].description == "Add two integers."
    assert offered[0].parameters == ADD_SCHEMA


@pytest.mark.parametrize(
    ("tool_filter", "offered"),
    [
        ({"deny": ["add"]}, ["echo", "other"]),
        ({"allow": ["add", "other"]}, ["add", "other"]),
        ({"allow": ["add", "echo"], "deny": ["echo"]}, ["add"]),
        ({"allow": []}, []),
        ({}, ["add", "echo", "other"]),
    ],
)
def test_the_descriptors_tool_filter_picks_the_tools_offered(
    runs: Runs, tool_filter: dict[str, Any], offered: list[str]
) -> None:
    model = ScriptedModel(["ok"])
    tools = [add_tool(), echo_tool(), echo_tool("other")]
    runs.start(model, tools=tools, desc=descriptor(tool_filter=tool_filter)).result()
    assert [t.name for t in model.calls[0].tools] == offered


def test_a_denied_tool_called_anyway_is_an_error_result_and_never_runs(runs: Runs) -> None:
    ran = threading.Event()
    secret = ChildTool("secret", "x", {"type": "object"}, lambda args: ran.set() or "leaked")
    model = ScriptedModel([calls(("c1", "secret", {})), "fine"])
    transcript = FakeTranscript()
    run = runs.start(
        model,
        transcript,
        tools=[secret, add_tool()],
        desc=descriptor(tool_filter={"deny": ["secret"]}),
    )
    assert run.result().stop_reason == "completed"
    assert not ran.is_set()
    assert results(transcript) == [
        {"id": "c1", "error": "unknown tool 'secret'; the tools are: add", **ONE_TOOL_CALL},
    ]
    assert model.calls[1].messages[-1].text == "error: unknown tool 'secret'; the tools are: add"


@pytest.mark.parametrize(
    "name", ["no_such_tool", "rm -rf /", "", "a" * 10_000, "add\u0000", "lone\ud800"]
)
def test_a_tool_name_that_does_not_exist_is_an_error_result_and_the_turn_goes_on(
    runs: Runs, name: str
) -> None:
    model = ScriptedModel([calls(("c1", name, {})), "recovered"])
    transcript = FakeTranscript()
    run = runs.start(model, transcript, tools=[add_tool()])
    assert run.result().output == [TextBlock(text="recovered")]
    (result,) = results(transcript)
    assert result["error"].startswith("unknown tool")
    assert result["error"].endswith("the tools are: add")
    assert len(result["error"]) < MAX_TOOL_TEXT_CHARS + 100
    for written in transcript.written:  # all of it storable as UTF-8
        json.dumps(written.data, ensure_ascii=False).encode("utf-8")


def test_several_calls_in_one_reply_run_in_order_before_the_next_model_call(runs: Runs) -> None:
    order: list[str] = []

    def record(args: dict[str, Any]) -> str:
        order.append(args["n"])
        return f"done {args['n']}"

    tool = ChildTool("step", "x", {"type": "object"}, record)
    model = ScriptedModel([calls(("a", "step", {"n": "1"}), ("b", "step", {"n": "2"})), "both"])
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[tool]).result()

    assert order == ["1", "2"]
    kinds = [w.kind for w in transcript.written]
    assert kinds == [
        EventKind.ASSISTANT_MESSAGE,
        "tool/call",
        "tool/result",
        "tool/call",
        "tool/result",
        EventKind.ASSISTANT_MESSAGE,
    ]
    second = model.calls[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool", "tool"]
    assert [m.tool_call_id for m in second[2:]] == ["a", "b"]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"a": 1, "b": ', "the arguments are not valid JSON"),
        ("[1, 2]", "the arguments must be a JSON object, not list"),
        ({"a": 1}, "invalid arguments: $.b is required"),
        ({"a": 1, "b": "two"}, "invalid arguments: $.b must be integer, not string"),
        ({"a": 1, "b": True}, "invalid arguments: $.b must be integer, not boolean"),
        ({"a": 1, "b": 2, "c": 3}, "invalid arguments: $ has an unknown property 'c'"),
    ],
)
def test_arguments_that_are_not_json_or_break_the_schema_are_an_error_result(
    runs: Runs, arguments: Any, error: str
) -> None:
    model = ScriptedModel([calls(("c1", "add", arguments)), "sorry"])
    transcript = FakeTranscript()
    assert runs.start(model, transcript, tools=[add_tool()]).result().stop_reason == "completed"
    (result,) = results(transcript)
    assert result["error"].startswith(error)
    # Malformed arguments are recorded as the model wrote them.
    (call,) = [w.data for w in transcript.written if w.kind == "tool/call"]
    if isinstance(arguments, str) and not arguments.startswith("["):
        assert call["arguments"] == arguments


class Search(BaseModel):
    query: str
    limit: int = 3


def test_a_pydantic_model_gives_the_schema_and_validates_the_arguments(runs: Runs) -> None:
    seen: list[dict[str, Any]] = []
    tool = ChildTool("search", "Search.", Search, lambda args: seen.append(args) or "hits")
    model = ScriptedModel(
        [calls(("c1", "search", {"query": "otters"}), ("c2", "search", {"limit": 1})), "done"]
    )
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[tool]).result()

    assert model.calls[0].tools[0].parameters == Search.model_json_schema()
    assert seen == [{"query": "otters", "limit": 3}]
    ok, bad = results(transcript)
    assert ok == {"id": "c1", "output": "hits", **ONE_TOOL_CALL}
    assert bad["error"].startswith("invalid arguments: query: Field required")


def test_a_raising_handler_is_an_error_result_the_model_reads(runs: Runs) -> None:
    def broken(args: dict[str, Any]) -> str:
        raise ValueError("disk on fire")

    model = ScriptedModel([calls(("c1", "broken", {})), "I could not"])
    transcript = FakeTranscript()
    run = runs.start(model, transcript, tools=[ChildTool("broken", "x", {}, broken)])
    assert run.result().output == [TextBlock(text="I could not")]
    assert results(transcript) == [
        {"id": "c1", "error": "ValueError: disk on fire", **ONE_TOOL_CALL}
    ]


def test_a_handler_returning_something_other_than_text_is_an_error_result(runs: Runs) -> None:
    model = ScriptedModel([calls(("c1", "num", {})), "ok"])
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[ChildTool("num", "x", {}, lambda args: 42)]).result()
    assert results(transcript) == [
        {"id": "c1", "error": "the tool returned int, not text", **ONE_TOOL_CALL}
    ]


def test_a_huge_output_is_bounded_in_the_transcript_and_for_the_model_with_a_marker(
    runs: Runs,
) -> None:
    huge = "x" * (MAX_TOOL_TEXT_CHARS + 12_345)
    model = ScriptedModel([calls(("c1", "dump", {})), "read it"])
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[ChildTool("dump", "x", {}, lambda args: huge)]).result()

    (result,) = results(transcript)
    assert result["output"].startswith("x" * MAX_TOOL_TEXT_CHARS)
    assert result["output"].endswith("…[truncated: 12,345 more characters not shown]")
    assert len(result["output"]) < MAX_TOOL_TEXT_CHARS + 100
    assert model.calls[1].messages[-1].text == result["output"]


def test_output_no_store_could_keep_is_made_storable(runs: Runs) -> None:
    model = ScriptedModel([calls(("c1", "odd", {})), "ok"])
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[ChildTool("odd", "x", {}, lambda a: "a\ud800b")]).result()
    assert results(transcript) == [{"id": "c1", "output": "a?b", **ONE_TOOL_CALL}]


def test_a_message_steered_during_a_tool_call_joins_the_next_model_call_after_the_results(
    runs: Runs,
) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(args: dict[str, Any]) -> str:
        entered.set()
        assert release.wait(TIMEOUT_S)
        return "slow result"

    model = ScriptedModel([calls(("c1", "slow", {})), "answer"])
    transcript = FakeTranscript()
    run = runs.start(model, transcript, tools=[ChildTool("slow", "x", {}, slow)], prompt="task")
    assert entered.wait(TIMEOUT_S)
    transcript.deliver(run, "also this")
    release.set()
    assert run.result().stop_reason == "completed"

    second = model.calls[1].messages
    assert [(m.role, m.text) for m in second] == [
        ("user", "task"),
        ("assistant", ""),
        ("tool", "slow result"),
        ("user", "also this"),
    ]


def test_a_kill_during_a_tool_call_reaches_the_handler_and_ends_the_turn_aborted(
    runs: Runs,
) -> None:
    entered = threading.Event()
    handler_saw: list[str | None] = []

    def waits_for_kill(args: dict[str, Any], signal: CancelSignal) -> str:
        entered.set()
        signal.wait(TIMEOUT_S)
        handler_saw.append(signal.reason)
        return "too late"

    model = ScriptedModel([calls(("c1", "wait", {})), "unreached"])
    transcript = FakeTranscript()
    signal = CancelSignal()
    run = runs.start(model, transcript, signal, tools=[ChildTool("wait", "x", {}, waits_for_kill)])
    assert entered.wait(TIMEOUT_S)
    signal.abort("killed by parent")

    assert run.result().stop_reason == "aborted"
    assert handler_saw == ["killed by parent"]
    assert model.call_count == 1
    # The call is on record; its result lost the race with the kill and is not written.
    assert [w.kind for w in transcript.written] == [EventKind.ASSISTANT_MESSAGE, "tool/call"]


def test_calls_without_ids_or_with_repeated_ids_get_distinct_ids(runs: Runs) -> None:
    model = ScriptedModel(
        [calls(("", "echo", {}), ("same", "echo", {}), ("same", "echo", {})), "ok"]
    )
    transcript = FakeTranscript()
    runs.start(model, transcript, tools=[echo_tool()]).result()
    ids = [r["id"] for r in results(transcript)]
    assert len(set(ids)) == 3
    assert ids[1] == "same"


def test_a_malformed_tool_filter_fails_the_start_and_starts_nothing() -> None:
    request = start_request(
        Parent(), FakeTranscript(), desc=descriptor(tool_filter={"allow": "add"})
    )
    provider = InProcessProvider(ScriptedModel(), tools=[add_tool()])
    with pytest.raises(SubagentControlError) as caught:
        provider.start(request, CancelSignal())
    assert caught.value.code is ErrorCode.INVALID_DESCRIPTOR
    assert "tool_filter['allow'] must be a list of tool names" in caught.value.message
    assert request.parent.registry.get(request.child_id) is None


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dots.not.allowed"])
def test_a_tool_name_the_api_would_refuse_is_refused(name: str) -> None:
    with pytest.raises(SubagentControlError) as caught:
        ChildTool(name, "x", {}, lambda args: "")
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_a_schema_that_is_not_a_json_object_is_refused() -> None:
    with pytest.raises(SubagentControlError) as caught:
        ChildTool("t", "x", {"type": {1, 2}}, lambda args: "")  # type: ignore[dict-item]
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_two_tools_of_one_name_are_refused() -> None:
    with pytest.raises(SubagentControlError) as caught:
        InProcessProvider(ScriptedModel(), tools=[echo_tool(), echo_tool()])
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "['echo']" in caught.value.message
