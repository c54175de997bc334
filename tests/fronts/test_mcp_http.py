"""The MCP front over streamable HTTP: the console script as a subprocess (reaped pass or
fail), real SDK clients, and the bad requests an HTTP server must refuse without changing
anything: no or a wrong bearer token (401), a request not addressed to loopback (403), an
oversized body (413), a body that is not JSON (415), malformed JSON-RPC (a JSON-RPC
error)."""

from __future__ import annotations

import http.client
import json
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from controlplane.fronts import MAX_BODY_BYTES, TOKEN_ENV
from controlplane.fronts.mcp_tasks import (
    CreatedTask,
    TaskNotice,
    TasksClient,
    follow_tasks,
    get_task,
)
from tests.fronts.mcp_support import HttpServer, run, text_of
from tests.reliability.processes import Reaper

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

TOKEN = "s3cret-token"
_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


def _client(url: str, token: str | None = None, **options: Any) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10.0, read=30.0))
    return Client(streamable_http_client(url, http_client=http), **options)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One raw POST; the status and the JSON body (None when there is none)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(
            "POST",
            parts.path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, None


def _tasks(url: str, token: str | None = None) -> str:
    async def conversation() -> str:
        async with _client(url, token) as client:
            return text_of(await client.call_tool("task_list", {}))

    return run(conversation)


def test_an_http_client_starts_a_child_and_waits_for_its_output(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url)

    async def conversation() -> tuple[str, str]:
        async with _client(server.url, extensions=[TasksClient()]) as client:
            created = await client.session.call_tool(
                "subagent", {"description": "d", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            waited = {"task_id": created.task_id, "wait": True, "timeout_s": 10}
            output = text_of(await client.call_tool("task_output", waited))
            return output, (await get_task(client.session, created.task_id)).status

    assert run(conversation) == ("echo: hi\n[status: completed]", "completed")


def test_no_or_a_wrong_bearer_token_gets_401_and_changes_nothing(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url, "--token", TOKEN)
    start = json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "subagent", "arguments": {"description": "d", "prompt": "x"}}}
    ).encode()  # fmt: skip

    refused = [
        _post(server.url, json.dumps(_INIT).encode()),
        _post(server.url, start, {"Authorization": "Bearer wrong"}),
        _post(server.url, start, {"Authorization": TOKEN}),  # not a bearer credential
    ]

    assert [status for status, _ in refused] == [401, 401, 401]
    assert all(body["error"]["code"] == -32600 for _, body in refused)
    assert _tasks(server.url, TOKEN) == "(no tasks)"


def _start(prompt: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "subagent", "arguments": {"description": "d", "prompt": prompt}}}
    ).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "rebound.example"}, 403),
        ({"Host": "127.0.0.1", "Origin": "https://evil.example"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ],
)
def test_what_a_web_page_could_send_a_loopback_server_is_refused(
    reaped: Reaper, sqlite_url: str, headers: dict[str, str], status: int
) -> None:
    """A request through a DNS name rebound to 127.0.0.1, a page of another origin, or a
    form or text post (which a browser sends cross-origin without a preflight) starts
    nothing; the SDK's own client (JSON posts, an SSE GET, a DELETE) is served as before."""
    server = HttpServer(reaped, sqlite_url)

    refused, body = _post(server.url, _start("from a web page"), headers)

    assert refused == status
    assert body["error"]["code"] == -32600
    assert _tasks(server.url) == "(no tasks)"


def test_an_oversized_body_gets_413_and_starts_nothing(reaped: Reaper, sqlite_url: str) -> None:
    server = HttpServer(reaped, sqlite_url)
    huge = json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "subagent",
                    "arguments": {"description": "d", "prompt": "x" * MAX_BODY_BYTES}}}
    ).encode()  # fmt: skip

    status, body = _post(server.url, huge)

    assert status == 413
    assert "over" in body["error"]["message"]
    assert _tasks(server.url) == "(no tasks)"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"jsonrpc": "2.0", "id": 1}',
        b'{"jsonrpc": "1.0", "id": 1, "method": "tools/call"}',
    ],
)
def test_malformed_json_rpc_gets_a_json_rpc_error_and_starts_nothing(
    reaped: Reaper, sqlite_url: str, body: bytes
) -> None:
    server = HttpServer(reaped, sqlite_url)

    status, answer = _post(server.url, body)

    assert status == 400
    assert answer["jsonrpc"] == "2.0"
    assert answer["error"]["code"] in (-32700, -32600, -32602)
    assert _tasks(server.url) == "(no tasks)"


def test_a_non_loopback_bind_without_a_token_generates_one_into_a_0600_file(
    reaped: Reaper, sqlite_url: str
) -> None:
    env_token = os.environ.pop(TOKEN_ENV, None)
    try:
        server = HttpServer(reaped, sqlite_url, bind="0.0.0.0:0")
    finally:
        if env_token is not None:
            os.environ[TOKEN_ENV] = env_token
    token_file = Path(server.process.expect("bearer token written to "))
    url = server.url.replace("0.0.0.0", "127.0.0.1")
    try:
        token = token_file.read_text(encoding="utf-8").strip()
        mode = stat.S_IMODE(token_file.stat().st_mode)

        status, _ = _post(url, json.dumps(_INIT).encode())

        assert mode == 0o600
        assert status == 401
        assert _tasks(url, token) == "(no tasks)"
    finally:
        token_file.unlink(missing_ok=True)


def test_a_followed_task_is_notified_over_http_until_settled(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url)
    seen: list[TaskNotice] = []
    settled = anyio.Event()

    async def on_status(notice: TaskNotice) -> None:
        seen.append(notice)
        if notice.status == "completed":
            settled.set()

    async def conversation() -> None:
        async with _client(server.url, extensions=[TasksClient(on_status=on_status)]) as client:
            created = await client.session.call_tool(
                "subagent", {"description": "d", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            await follow_tasks(client.session, [created.task_id], timeout_s=20)
            await settled.wait()

    run(conversation)

    assert seen[-1].status == "completed"
    assert seen[-1].result is not None
