"""`OpenAIChatModel` against a real Chat Completions server on 127.0.0.1 (no mocked transport)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    ModelSelector,
    SubagentControl,
    SubagentControlError,
    TextBlock,
)
from controlplane.models import (
    ChatMessage,
    ModelRequest,
    ToolCall,
    ToolDefinition,
)

from .fakes import FakeTranscript, Runs, descriptor
from .openai_server import ChatServer

openai = pytest.importorskip("openai", reason="the openai extra is not installed")
from controlplane.models import OpenAIChatModel  # noqa: E402

TIMEOUT_S = 5.0
HELLO = ModelRequest(messages=[ChatMessage(role="user", text="hello")])


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running
        running.answer.set()  # free any stalled handler before the server goes


def model_on(server: ChatServer, **options: Any) -> OpenAIChatModel:
    return OpenAIChatModel("default-model", base_url=server.base_url, retry_base_s=0.01, **options)


class Pending:
    """A `complete` call running in its own thread, so a test can kill it mid-call."""

    def __init__(self, model: OpenAIChatModel, request: ModelRequest = HELLO) -> None:
        self.signal = CancelSignal()
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(model, request), daemon=True)
        self._thread.start()

    def _run(self, model: OpenAIChatModel, request: ModelRequest) -> None:
        try:
            model.complete(request, self.signal)
        except BaseException as exc:
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


@pytest.mark.parametrize("stream", [True, False])
def test_a_reply_is_read_streamed_or_not(server: ChatServer, stream: bool) -> None:
    server.script({"text": "a streamed answer, in pieces"})
    reply = model_on(server, stream=stream).complete(HELLO, CancelSignal())
    assert reply.text == "a streamed answer, in pieces"
    assert reply.stop_reason == "completed"
    assert server.requests[0].get("stream", False) is stream


def test_the_persona_is_the_system_message_and_the_selector_names_the_model(
    server: ChatServer,
) -> None:
    request = ModelRequest(
        system="You are terse.",
        messages=[ChatMessage(role="user", text="hi")],
        model=ModelSelector(provider="local", model="llama-3"),
    )
    model_on(server, temperature=0.1).complete(request, CancelSignal())
    model_on(server).complete(HELLO, CancelSignal())

    first, second = server.requests
    assert first["model"] == "llama-3"
    assert first["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ]
    assert first["temperature"] == 0.1
    assert second["model"] == "default-model"
    assert "tools" not in second


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_split_across_chunks_are_put_back_together(
    server: ChatServer, stream: bool
) -> None:
    server.script(
        {
            "tool_calls": [
                {"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}},
                {"id": "call_2", "name": "echo", "arguments": '{"text": "hi"}'},
            ]
        }
    )
    request = HELLO.model_copy(
        update={"tools": [ToolDefinition(name="add", parameters={"type": "object"})]}
    )
    reply = model_on(server, stream=stream).complete(request, CancelSignal())
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="add", arguments='{"a": 2, "b": 3}'),
        ToolCall(id="call_2", name="echo", arguments='{"text": "hi"}'),
    ]
    assert reply.stop_reason == "completed"
    assert server.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "", "parameters": {"type": "object"}},
        }
    ]


def test_a_child_calls_a_tool_and_the_server_sees_the_whole_exchange(
    server: ChatServer, runs: Runs
) -> None:
    server.script(
        {"tool_calls": [{"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"text": "2 + 3 = 5"},
    )
    tools = [
        ChildTool("add", "Add.", {"type": "object"}, lambda a: str(a["a"] + a["b"])),
        ChildTool("rm", "Remove files.", {"type": "object"}, lambda a: "removed"),
    ]
    run = runs.start(
        model_on(server),
        FakeTranscript(),
        tools=tools,
        prompt="add 2 and 3",
        desc=descriptor(persona="math helper", tool_filter={"deny": ["rm"]}),
    )
    result = run.result()

    assert result.output == [TextBlock(text="2 + 3 = 5")]
    first, second = server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]  # rm is never offered
    assert second["messages"] == [
        {"role": "system", "content": "math helper"},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]


def test_a_child_steered_mid_stream_is_resumed_with_the_conversation_its_live_model_saw(
    server: ChatServer, tmp_path: Path
) -> None:
    # The steer lands while the server is half-way through streaming the first reply.
    server.script({"text": "the first part of a long answer", "pause": 3}, {"text": "second"})
    control = SubagentControl.open(f"sqlite:///{tmp_path}/state.db")
    try:
        control.providers.register(InProcessProvider(model_on(server)))
        parent = control.agents.register("parent-1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="x", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        assert server.paused.wait(TIMEOUT_S)
        steer = control.send_message(parent, started.child_id, [TextBlock(text="focus on B")])
        assert steer.route == "steered"
        server.answer.set()
        control.tasks.wait(started.task_id, timeout=TIMEOUT_S, requester=parent)
        follow_up = control.send_message(parent, started.child_id, [TextBlock(text="more")])
        control.tasks.wait(follow_up.task_id, timeout=TIMEOUT_S, requester=parent)
    finally:
        control.close()

    _, live, resumed = server.requests
    assert [(m["role"], m["content"]) for m in live["messages"]] == [
        ("user", "go"),
        ("assistant", "the first part of a long answer"),
        ("user", "focus on B"),
    ]
    assert resumed["messages"] == [
        *live["messages"],
        {"role": "assistant", "content": "second"},
        {"role": "user", "content": "more"},
    ]


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", "max-tokens"), ("content_filter", "refusal"), ("stop", "completed")],
)
def test_finish_reasons_map_to_stop_reasons(server: ChatServer, finish: str, reason: str) -> None:
    server.script({"text": "cut", "finish": finish})
    assert model_on(server).complete(HELLO, CancelSignal()).stop_reason == reason


def test_a_kill_mid_stream_ends_the_call_and_closes_the_connection_at_once(
    server: ChatServer,
) -> None:
    server.script({"hang": True, "text": "thinking very hard"})
    pending = Pending(model_on(server))
    assert server.hanging.wait(TIMEOUT_S)

    pending.signal.abort("killed by parent")

    assert pending.wait(1.0), "the call did not return promptly after the kill"
    assert isinstance(pending.error, SubagentControlError)
    assert pending.error.code is ErrorCode.CANCELLED
    assert server.disconnected.wait(1.0), "the server never saw the client go"


def test_a_kill_before_the_server_answers_ends_the_call_at_once_and_cuts_the_late_stream(
    server: ChatServer,
) -> None:
    server.script({"stall": True, "hang": True, "text": "late"})
    pending = Pending(model_on(server))
    assert server.stalled.wait(TIMEOUT_S)

    pending.signal.abort("killed by parent")
    assert pending.wait(1.0)
    assert isinstance(pending.error, SubagentControlError)
    assert pending.error.code is ErrorCode.CANCELLED

    server.answer.set()  # the answer comes after all; its stream is cut as it arrives
    assert server.disconnected.wait(TIMEOUT_S)


def test_a_rate_limit_is_retried_after_the_wait_the_server_asks(server: ChatServer) -> None:
    server.script(
        {"status": 429, "message": "slow down", "headers": {"Retry-After": "0"}},
        {"status": 503, "message": "overloaded", "headers": {"retry-after-ms": "1"}},
        {"text": "finally"},
    )
    assert model_on(server).complete(HELLO, CancelSignal()).text == "finally"
    assert len(server.requests) == 3


def test_a_server_error_that_persists_fails_the_turn_with_its_words_after_bounded_retries(
    server: ChatServer,
) -> None:
    server.script(*[{"status": 500, "message": "GPU on fire"}] * 3)
    with pytest.raises(SubagentControlError) as caught:
        model_on(server, max_retries=2).complete(HELLO, CancelSignal())
    assert caught.value.code is ErrorCode.INTERNAL
    assert "answered HTTP 500: GPU on fire" in caught.value.message
    assert len(server.requests) == 3


def test_a_bad_request_fails_at_once_with_the_servers_message(server: ChatServer) -> None:
    server.script({"status": 400, "message": "model 'nope' does not exist"})
    with pytest.raises(SubagentControlError) as caught:
        model_on(server).complete(HELLO, CancelSignal())
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "HTTP 400: model 'nope' does not exist" in caught.value.message
    assert len(server.requests) == 1


def test_a_kill_during_a_retry_wait_ends_the_call_at_once(server: ChatServer) -> None:
    server.script({"status": 429, "message": "later", "headers": {"Retry-After": "60"}})
    pending = Pending(model_on(server, max_retry_wait_s=60.0))
    assert server.wait_requests(1, TIMEOUT_S)
    pending.signal.abort("killed")
    assert pending.wait(1.0)
    assert isinstance(pending.error, SubagentControlError)
    assert pending.error.code is ErrorCode.CANCELLED
    assert len(server.requests) == 1


def test_an_unreachable_server_fails_the_turn_saying_so() -> None:
    with ChatServer() as gone:
        url = gone.base_url
    model = OpenAIChatModel("m", base_url=url, max_retries=1, retry_base_s=0.01)
    with pytest.raises(SubagentControlError) as caught:
        model.complete(HELLO, CancelSignal())
    assert f"could not reach the model server at {url}" in caught.value.message


def test_a_client_passed_in_is_used_with_its_own_retries_off(server: ChatServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=5)
    server.script({"status": 400, "message": "no"})
    with pytest.raises(SubagentControlError):
        OpenAIChatModel("m", client=client).complete(HELLO, CancelSignal())
    assert len(server.requests) == 1


def test_without_the_extra_the_adapter_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "from controlplane.models import OpenAIChatModel\n"
        "try:\n    OpenAIChatModel('m')\nexcept ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'subagent-control[openai]'" in out.stdout
