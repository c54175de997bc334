"""Bad input to the A2A front gets an HTTP or a JSON-RPC error and changes nothing: an
oversized body, malformed JSON-RPC, a message that is not text, a missing or wrong token,
and another parent session's Task or context."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane import AgentHandle, InProcessProvider, ScriptedModel, SubagentControl
from controlplane.contract import TaskStatus
from tests.fakes import FakeProvider
from tests.fronts.a2a_support import (
    CancelTaskRequest,
    GetTaskRequest,
    InvalidParamsError,
    Part,
    TaskNotFoundError,
    UnsupportedOperationError,
    a2a_client,
    message,
    run,
    send,
    served,
    stream,
    subscribe,
)
from tests.support import WAIT_S, events, eventually, inbound, is_durable, start_child

pytestmark = pytest.mark.timeout(60)

HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}


@pytest.fixture
def a2a_parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("a2a")


@pytest.fixture
def model(control: SubagentControl) -> Iterator[ScriptedModel]:
    """Gated, so another session's child stays running while the test pokes at it."""
    gated = ScriptedModel(echo=True, gated=True)
    control.providers.register(InProcessProvider(gated))
    yield gated
    gated.release(100)


def nothing_started(control: SubagentControl, parent: AgentHandle) -> bool:
    assert control.store is not None
    return control.tasks.list(parent) == [] and control.store.list_children() == []


def send_json(text: str, *, message_id: str = "m1") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]},
            "configuration": {"returnImmediately": True},
        },
    }


def test_an_oversized_body_is_refused_with_413_and_starts_nothing(
    control: SubagentControl, a2a_parent: AgentHandle, model: ScriptedModel
) -> None:
    body = json.dumps(send_json("x" * 5000)).encode()
    with served(control, a2a_parent, provider="inprocess", max_body=4096) as url:
        declared = httpx.post(url, content=body, headers=HEADERS, timeout=WAIT_S)
        chunked = httpx.post(
            url, content=iter([body[:3000], body[3000:]]), headers=HEADERS, timeout=WAIT_S
        )
        small = httpx.post(url, json=send_json("fits"), headers=HEADERS, timeout=WAIT_S)

    assert declared.status_code == 413
    assert chunked.status_code == 413
    assert "result" in small.json()  # the cap is not a refusal of everything
    assert len(control.tasks.list(a2a_parent)) == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        # 100,000 levels deep: a parse error, not an internal one ("maximum recursion depth
        # exceeded", -32603, before the guard measured the nesting).
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}",
            -32700,
        ),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
        (b"[]", -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod", "params": {}}', -32601),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": 7}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}', -32602),
    ],
)
def test_malformed_json_rpc_gets_a_json_rpc_error_and_starts_nothing(
    control: SubagentControl, a2a_parent: AgentHandle, model: ScriptedModel, body: bytes, code: int
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:
        answer = httpx.post(url, content=body, headers=HEADERS, timeout=WAIT_S)

    assert answer.json()["error"]["code"] == code
    assert nothing_started(control, a2a_parent)


@pytest.mark.parametrize(
    "parts",
    [[Part(url="https://example.invalid/x")], [Part(text="  ")], [], [Part(text="x" * 100_001)]],
)
def test_a_message_that_is_not_text_is_invalid_and_starts_nothing(
    control: SubagentControl, a2a_parent: AgentHandle, model: ScriptedModel, parts: list[Part]
) -> None:
    request = message("placeholder")
    del request.message.parts[:]
    request.message.parts.extend(parts)
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> None:
            async with a2a_client(url) as client:
                with pytest.raises(InvalidParamsError):
                    await stream(client.send_message(request))

        run(body)

    assert nothing_started(control, a2a_parent)


def test_a_missing_or_wrong_token_gets_401_and_changes_nothing(
    control: SubagentControl, a2a_parent: AgentHandle, model: ScriptedModel
) -> None:
    body = send_json("hello")
    with served(control, a2a_parent, provider="inprocess", token="s3cret") as url:
        missing = httpx.post(url, json=body, headers=HEADERS, timeout=WAIT_S)
        wrong = httpx.post(
            url, json=body, headers={**HEADERS, "Authorization": "Bearer nope"}, timeout=WAIT_S
        )
        card = httpx.get(f"{url}.well-known/agent-card.json", timeout=WAIT_S)
        assert nothing_started(control, a2a_parent)

        async def with_token() -> str:
            async with a2a_client(url, streaming=False, token="s3cret") as client:
                return (await send(client, message("hello"))).id

        task_id = run(with_token)

    assert missing.status_code == 401
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"].startswith("Bearer")
    assert card.status_code == 200  # the card says how to authenticate
    assert "bearer" in card.json()["securitySchemes"]
    assert [t.id for t in control.tasks.list(a2a_parent)] == [task_id]


def test_another_sessions_task_and_context_are_not_found_and_nothing_changes(
    control: SubagentControl, a2a_parent: AgentHandle, model: ScriptedModel
) -> None:
    other = control.agents.register("other")
    theirs = start_child(control, other, provider="inprocess", prompt="private")
    assert model.wait_for_calls(1, WAIT_S)
    eventually(lambda: is_durable(control, theirs.child_id), "their child is published")
    before = events(control, theirs.child_id)

    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> None:
            async with a2a_client(url, streaming=False) as client:
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id=theirs.task_id))
                with pytest.raises(TaskNotFoundError):
                    await send(client, message("steer", context_id=theirs.child_id))
                with pytest.raises(TaskNotFoundError):
                    await send(client, message("steer", task_id=theirs.task_id))
                with pytest.raises(TaskNotFoundError):
                    await client.cancel_task(CancelTaskRequest(id=theirs.task_id))
            async with a2a_client(url) as client:
                with pytest.raises(TaskNotFoundError):
                    await stream(subscribe(client, theirs.task_id))

        run(body)

    assert control.tasks.get(theirs.task_id, requester=other).status is TaskStatus.RUNNING
    assert events(control, theirs.child_id) == before
    assert control.tasks.list(a2a_parent) == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"A2A-Version": "1.0", "Content-Type": "text/plain"}, 415),
        ({"A2A-Version": "1.0"}, 415),
        ({**HEADERS, "Host": "rebound.example:8000"}, 403),
    ],
)
def test_what_a_web_page_could_send_a_loopback_server_is_refused(
    control: SubagentControl,
    a2a_parent: AgentHandle,
    model: ScriptedModel,
    headers: dict[str, str],
    status: int,
) -> None:
    """A cross-origin form or text post (sent without a preflight), or a request through a
    DNS name rebound to 127.0.0.1, starts nothing."""
    body = json.dumps(send_json("from a web page")).encode()
    with served(control, a2a_parent, provider="inprocess") as url:
        answer = httpx.post(url, content=body, headers=headers, timeout=WAIT_S)

    assert answer.status_code == status
    assert nothing_started(control, a2a_parent)


def test_a_steer_the_running_child_cannot_take_is_refused_and_not_delivered(
    control: SubagentControl,
    a2a_parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    """A run without live delivery (an ACP child's, say) refuses a steer: NOT_DELIVERED, as
    an A2A error naming it; the Task runs on and its transcript has no steering record."""
    plan = provider.plan(result_gate=hold, steerable=False)
    with served(control, a2a_parent, provider="fake") as url:

        async def body() -> tuple[str, str]:
            async with a2a_client(url, streaming=False) as client:
                started = await send(client, message("first"))
                assert await asyncio.to_thread(plan.returned.wait, WAIT_S)
                with pytest.raises(UnsupportedOperationError, match="not delivered"):
                    await send(client, message("steer", context_id=started.context_id))
                return started.id, started.context_id

        task_id, context = run(body)

    assert control.tasks.get(task_id, requester=a2a_parent).status is TaskStatus.RUNNING
    assert inbound(events(control, context), "steer") == []
