"""Approvals over A2A, with the SDK's own client: a Task waiting on an approval reads
``input-required`` and carries the request (tool, arguments, request id) in its status
message; a reply to that Task saying allow or deny (a data part, or plain words) answers it
once, and is never stored as a steer; a reply that says neither is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from controlplane import (
    AgentHandle,
    ChildTool,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
)
from controlplane.contract import EventKind
from controlplane.models import ModelReply, ToolCall
from tests.fronts.a2a_support import (
    InvalidParamsError,
    Part,
    TaskState,
    a2a_client,
    message,
    run,
    send,
    served,
    wait_state,
)
from tests.support import events

pytestmark = pytest.mark.timeout(60)

WAITING = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED


class Deploys:
    """A ``deploy`` tool that needs approval and counts its runs."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.tool = ChildTool("deploy", "Deploy.", {"type": "object"}, self._run, approval="always")

    def _run(self, arguments: dict[str, Any]) -> str:
        self.runs.append(arguments)
        return f"deployed {arguments['env']}"


@pytest.fixture
def deploys(control: SubagentControl) -> Deploys:
    tool = Deploys()
    call = ToolCall(id="c1", name="deploy", arguments={"env": "prod"})
    model = ScriptedModel([ModelReply(text="shipping", tool_calls=[call]), "all done"])
    control.providers.register(InProcessProvider(model, tools=[tool.tool]))
    return tool


@pytest.fixture
def a2a_parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("a2a")


@pytest.fixture
def a2a_url(control: SubagentControl, a2a_parent: AgentHandle) -> Iterator[str]:
    with served(control, a2a_parent, provider="inprocess") as found:
        yield found


def _data(part: Any) -> Any:
    return json_format.MessageToDict(part.data)


def _reply(text: str = "", data: dict[str, Any] | None = None, **ids: str) -> Any:
    request = message(text or "x", **ids)
    del request.message.parts[:]
    if text:
        request.message.parts.append(Part(text=text))
    if data is not None:
        value = Value()
        json_format.ParseDict(data, value)
        request.message.parts.append(Part(data=value))
    return request


@pytest.mark.parametrize(
    ("reply", "allow", "note"),
    [
        ({"data": {"allow": True, "note": "ship it"}}, True, "ship it"),
        ({"text": "allow - looks fine"}, True, "looks fine"),
        ({"text": "deny: not during the freeze"}, False, "not during the freeze"),
        ({"data": {"decision": "deny"}}, False, None),
    ],
    ids=["data-allow", "words-allow", "words-deny", "data-decision-deny"],
)
def test_a_reply_to_a_waiting_task_answers_its_request_once_and_is_no_steer(
    control: SubagentControl,
    deploys: Deploys,
    a2a_url: str,
    reply: dict[str, Any],
    allow: bool,
    note: str | None,
) -> None:
    async def drive() -> tuple[Any, Any, Any]:
        async with a2a_client(a2a_url, streaming=False) as client:
            started = await send(client, message("ship"))
            waiting = await wait_state(client, started.id, WAITING)
            answered = await send(
                client, _reply(context_id=started.context_id, task_id=started.id, **reply)
            )
            done = await wait_state(client, started.id, COMPLETED)
            return waiting, answered, done

    waiting, answered, done = run(drive)

    words, data = waiting.status.message.parts
    assert "deploy" in words.text
    assert "allow" in words.text
    request = _data(data)
    assert (request["tool"], request["arguments"]) == ("deploy", {"env": "prod"})
    assert answered.id == waiting.id
    assert answered.status.state != WAITING
    assert done.status.state == COMPLETED
    stored = events(control, waiting.context_id)
    answers = [e for e in stored if e.kind == EventKind.APPROVAL_ANSWER]
    assert [(e.data["id"], e.data["allow"], e.data.get("note")) for e in answers] == [
        (request["request_id"], allow, note)
    ]
    assert [e for e in stored if e.kind == EventKind.STEERING_MESSAGE] == []
    assert deploys.runs == ([{"env": "prod"}] if allow else [])


def test_a_reply_that_says_neither_allow_nor_deny_is_refused_and_the_task_still_waits(
    control: SubagentControl, deploys: Deploys, a2a_url: str
) -> None:
    async def drive() -> tuple[Any, str, Any]:
        async with a2a_client(a2a_url, streaming=False) as client:
            started = await send(client, message("ship"))
            await wait_state(client, started.id, WAITING)
            with pytest.raises(InvalidParamsError) as refused:
                await send(
                    client,
                    message(
                        "what is the weather like?",
                        context_id=started.context_id,
                        task_id=started.id,
                    ),
                )
            still = await wait_state(client, started.id, WAITING)
            return started, str(refused.value), still

    started, refusal, still = run(drive)

    assert "reply 'allow' or 'deny'" in refusal
    assert still.status.state == WAITING
    stored = events(control, started.context_id)
    assert not any(e.kind == EventKind.STEERING_MESSAGE for e in stored)
    assert not any(e.kind == EventKind.APPROVAL_ANSWER for e in stored)
    assert deploys.runs == []
