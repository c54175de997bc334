"""Usage, recorded durably (SPEC §11): every model call's usage written with the message it
belongs to, each tool result counted, and `control.usage` summing a child's turns from the
store, across resumes and restarts, for its parent only.

The servers are real: a Chat Completions server on 127.0.0.1 (`ChatServer`) sending usage
streamed and not, or none; the stores are SQLite in ``tmp_path`` and PostgreSQL when its
URL is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    ForkProvider,
    InProcessProvider,
    NewEvent,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.aio import AsyncSubagentControl
from controlplane.contract import AgentHandle, usage_of
from controlplane.models import ChatMessage, ModelReply, ModelRequest, ToolCall

from .openai_server import ChatServer

openai = pytest.importorskip("openai", reason="the openai extra is not installed")
from controlplane.models import OpenAIChatModel  # noqa: E402

WAIT_S = 5.0
HELLO = ModelRequest(messages=[ChatMessage(role="user", text="hello")])
SERVER_USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
    "completion_tokens_details": {"reasoning_tokens": 12},
}
AS_OURS = Usage(input_tokens=120, output_tokens=30, cached_input_tokens=100, reasoning_tokens=12)


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running
        running.answer.set()


def model_on(server: ChatServer, **options: Any) -> OpenAIChatModel:
    return OpenAIChatModel("m", base_url=server.base_url, retry_base_s=0.01, **options)


def start(control: SubagentControl, parent: AgentHandle, prompt: str, provider: str) -> str:
    started = control.start_continuable(
        ContinuableStartSpec(
            provider=provider, label="spender", prompt=[TextBlock(text=prompt)], parent=parent
        )
    )
    settle(control, started.task_id, parent)
    return started.child_id


def settle(control: SubagentControl, task_id: str, parent: AgentHandle) -> None:
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert snapshot.status is TaskStatus.COMPLETED, snapshot


def resume(control: SubagentControl, parent: AgentHandle, child_id: str, text: str) -> None:
    sent = control.send_message(parent, child_id, [TextBlock(text=text)])
    assert sent.route == "started"
    settle(control, sent.task_id, parent)


def replies(control: SubagentControl, child_id: str) -> list[dict[str, Any]]:
    assert control.store is not None
    events = control.store.load(child_id).events
    return [e.data for e in events if e.kind == EventKind.ASSISTANT_MESSAGE]


def event(data: Any, seq: int = 1) -> SessionEvent:
    return SessionEvent(
        seq=seq, turn=1, kind="assistant/message", data=data, created_at=datetime.now(UTC)
    )


# -- the value -----------------------------------------------------------------------------


def test_usages_add_field_by_field_and_an_unknown_cost_does_not_hide_a_known_one() -> None:
    a = Usage(input_tokens=3, output_tokens=1, model_calls=1)
    b = Usage(input_tokens=4, cached_input_tokens=2, tool_calls=1, cost=0.25)

    total = a + b

    assert total == Usage(
        input_tokens=7, output_tokens=1, cached_input_tokens=2, model_calls=1, tool_calls=1,
        cost=0.25,
    )  # fmt: skip
    assert (Usage(cost=0.5) + b).cost == 0.75
    assert (a + a).cost is None
    assert Usage.zero() + a == a
    assert total.total_tokens == 8
    with pytest.raises(Exception):  # noqa: B017, PT011 (frozen: pydantic's own error)
        a.input_tokens = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        {"input_tokens": -1},
        {"tool_calls": "3"},
        {"output_tokens": 1.5},
        {"model_calls": True},
        {"cost": -0.01},
        {"cost": float("nan")},
        {"cost": "free"},
        {"tokens": 3},
    ],
)
def test_a_usage_that_is_not_counts_is_an_invalid_input_error_wherever_it_is_given(
    fields: dict[str, Any],
) -> None:
    for make in (
        lambda: Usage(**fields),
        lambda: Usage.model_validate(fields),
        lambda: ModelReply(text="x", usage=fields),
        lambda: ScriptedModel(["x"], usage=fields),
        lambda: ScriptedModel(["x"], usage=[fields]),
    ):
        with pytest.raises(SubagentControlError) as caught:
            make()
        assert caught.value.code is ErrorCode.INVALID_INPUT


def test_usage_of_sums_what_events_recorded_and_skips_what_is_not_a_usage() -> None:
    events = [
        event({"text": "a", "usage": {"input_tokens": 5, "model_calls": 1}}),
        event({"text": "b", "usage": {"model_calls": 1}, "usage_reported": False}),
        event({"id": "c1", "output": "x", "usage": {"tool_calls": 1}}),
        event({"text": "c"}),  # written before usage was recorded
        event({"text": "d", "usage": {"input_tokens": -4}}),  # not ours to guess at
        event({"text": "e", "usage": "lots"}),
        event("not even a mapping"),
    ]

    assert usage_of(events) == Usage(input_tokens=5, model_calls=2, tool_calls=1)
    assert usage_of([]) == Usage.zero()


# -- ScriptedModel -------------------------------------------------------------------------


def test_a_scripted_model_reports_the_usage_declared_for_each_reply() -> None:
    own = Usage(input_tokens=9)
    model = ScriptedModel(
        ["one", ModelReply(text="two", usage=own), "three"],
        usage=[{"input_tokens": 1}, {"input_tokens": 2}, None],
    )

    got = [model.complete(HELLO, CancelSignal()).usage for _ in range(4)]

    # A reply's own usage wins; the last reply, repeated, repeats its (absent) usage.
    assert got == [Usage(input_tokens=1), own, None, None]


def test_a_scripted_model_with_one_usage_reports_it_for_every_call_echo_included() -> None:
    model = ScriptedModel(usage=Usage(input_tokens=2, output_tokens=1))

    reply = model.complete(HELLO, CancelSignal())

    assert reply.text == "echo: hello"
    assert reply.usage == Usage(input_tokens=2, output_tokens=1)
    assert ScriptedModel(["x"]).complete(HELLO, CancelSignal()).usage is None


def test_a_usage_list_that_does_not_match_the_replies_is_refused() -> None:
    with pytest.raises(SubagentControlError) as caught:
        ScriptedModel(["one", "two"], usage=[Usage()])
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "2 replies" in caught.value.message


# -- OpenAIChatModel against a real server ------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_the_servers_usage_is_read_streamed_or_not(server: ChatServer, stream: bool) -> None:
    server.script({"text": "counted", "usage": SERVER_USAGE})

    reply = model_on(server, stream=stream).complete(HELLO, CancelSignal())

    assert reply.text == "counted"
    assert reply.usage == AS_OURS
    body = server.requests[0]
    if stream:
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert "stream_options" not in body


@pytest.mark.parametrize("stream", [True, False])
def test_a_server_that_sends_no_usage_gives_none_not_zeros(
    server: ChatServer, stream: bool
) -> None:
    server.script({"text": "uncounted"})

    reply = model_on(server, stream=stream).complete(HELLO, CancelSignal())

    assert reply.text == "uncounted"
    assert reply.usage is None


def test_a_server_usage_without_details_counts_what_it_gives(server: ChatServer) -> None:
    server.script({"text": "x", "usage": {"prompt_tokens": 7, "completion_tokens": 2}})

    reply = model_on(server).complete(HELLO, CancelSignal())

    assert reply.usage == Usage(input_tokens=7, output_tokens=2)


def test_the_callers_stream_options_win_so_a_server_that_refuses_the_field_can_be_used(
    server: ChatServer,
) -> None:
    server.script({"text": "x", "usage": SERVER_USAGE})
    model = model_on(server, stream_options={"include_usage": False})

    reply = model.complete(HELLO, CancelSignal())

    assert server.requests[0]["stream_options"] == {"include_usage": False}
    assert reply.usage is None  # not asked for, so the server sent none


@pytest.mark.parametrize("stream", [True, False])
def test_a_usage_report_that_is_not_counts_is_ignored_and_the_reply_kept(
    server: ChatServer, stream: bool
) -> None:
    server.script({"text": "kept", "usage": {"prompt_tokens": -5, "completion_tokens": 1}})

    reply = model_on(server, stream=stream).complete(HELLO, CancelSignal())

    assert reply.text == "kept"
    assert reply.usage is None


# -- recorded with the message, summed by control.usage -----------------------------------


@pytest.fixture
def control(store_url: str) -> Iterator[SubagentControl]:
    with SubagentControl.open(store_url) as opened:
        yield opened


def test_each_calls_usage_is_written_with_its_message_and_tool_results_are_counted(
    control: SubagentControl, server: ChatServer
) -> None:
    server.script(
        {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
         "usage": SERVER_USAGE},
        {"text": "it is 5"},  # this server call reports nothing
    )  # fmt: skip
    add = ChildTool("add", "Add.", {"type": "object"}, lambda a: str(a["a"] + a["b"]))
    control.providers.register(InProcessProvider(model_on(server), tools=[add]))
    parent = control.agents.register("parent-1")

    child_id = start(control, parent, "2 + 3?", "inprocess")

    assert [{k: v for k, v in r.items() if k != "text"} for r in replies(control, child_id)] == [
        {"steering_seen": 0, "usage": {**AS_OURS.stored(), "model_calls": 1}},
        {"steering_seen": 0, "usage": {"model_calls": 1}, "usage_reported": False},
    ]
    assert control.usage(parent, child_id) == AS_OURS + Usage(model_calls=2, tool_calls=1)


def test_a_resumed_childs_usage_is_summed_over_its_turns_and_survives_a_restart(
    store_url: str,
) -> None:
    def model() -> ScriptedModel:
        return ScriptedModel(
            [
                ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})]),
                "first",
                "second",
            ],
            usage=[
                Usage(input_tokens=10, output_tokens=1),
                Usage(input_tokens=20, output_tokens=2, cost=0.5),
                Usage(input_tokens=40, output_tokens=4, cached_input_tokens=30),
            ],
        )

    look = ChildTool("look", "Look.", {"type": "object"}, lambda _a: "seen")
    expected_first = Usage(input_tokens=30, output_tokens=3, model_calls=2, tool_calls=1, cost=0.5)
    with SubagentControl.open(store_url) as first:
        first.providers.register(InProcessProvider(model(), tools=[look]))
        parent = first.agents.register("parent-1")
        child_id = start(first, parent, "go", "inprocess")
        assert first.usage(parent, child_id) == expected_first
        assert first.usage("parent-1", child_id) == expected_first  # a session id will do

    with SubagentControl.open(store_url) as second:
        # A new process would start the script over; skip to what the third call returns.
        scripted = model()
        for _ in range(2):
            scripted.complete(HELLO, CancelSignal())
        second.providers.register(InProcessProvider(scripted, tools=[look]))
        parent = second.agents.register("parent-1")
        assert second.usage(parent, child_id) == expected_first  # read from the store
        resume(second, parent, child_id, "again")

        assert second.usage(parent, child_id) == expected_first + Usage(
            input_tokens=40, output_tokens=4, cached_input_tokens=30, model_calls=1
        )


def test_usage_is_refused_to_anyone_but_the_parent_exactly_as_for_an_unknown_child(
    control: SubagentControl,
) -> None:
    control.providers.register(InProcessProvider(ScriptedModel(["done"], usage=Usage())))
    parent = control.agents.register("parent-1")
    stranger = control.agents.register("stranger")
    child_id = start(control, parent, "go", "inprocess")

    refusals = []
    for requester, asked in [
        (stranger, child_id),
        ("stranger", child_id),
        (parent, "no-such-child"),
        (parent, ""),
        (parent, "bad\x00id"),
    ]:
        with pytest.raises(SubagentControlError) as caught:
            control.usage(requester, asked)
        refusals.append(caught.value.code)
        assert caught.value.message.replace(repr(asked), "<id>") == (
            "no child <id> for this session; list your children and use one of those ids"
        )
    assert set(refusals) == {ErrorCode.CHILD_NOT_FOUND}
    assert control.usage(parent, child_id) == Usage(model_calls=1)
    with pytest.raises(SubagentControlError) as caught:
        control.usage(42, child_id)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_a_forks_usage_leaves_out_the_parents_history_it_was_seeded_with(
    control: SubagentControl,
) -> None:
    control.providers.register(ForkProvider(ScriptedModel(["forked"], usage=Usage(input_tokens=3))))
    parent = control.agents.register("parent-1")
    seed = [
        NewEvent(kind="user/message", turn=0, data={"text": "earlier"}),
        NewEvent(
            kind="assistant/message",
            turn=0,
            data={"text": "earlier answer", "usage": {"input_tokens": 1000, "model_calls": 1}},
        ),
    ]
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="fork", label="fork", prompt=[TextBlock(text="go on")], parent=parent,
            seed_events=seed,
        )
    )  # fmt: skip
    settle(control, started.task_id, parent)

    assert control.usage(parent, started.child_id) == Usage(input_tokens=3, model_calls=1)


def test_usage_after_close_is_a_closed_error(store_url: str) -> None:
    control = SubagentControl.open(store_url)
    control.close()
    with pytest.raises(SubagentControlError) as caught:
        control.usage("parent-1", "any")
    assert caught.value.code is ErrorCode.CLOSED


def test_the_asyncio_front_reads_usage_too(control: SubagentControl) -> None:
    control.providers.register(
        InProcessProvider(ScriptedModel(["done"], usage=Usage(input_tokens=4)))
    )
    parent = control.agents.register("parent-1")
    child_id = start(control, parent, "go", "inprocess")

    got = asyncio.run(AsyncSubagentControl(control).usage(parent, child_id))

    assert got == Usage(input_tokens=4, model_calls=1)
