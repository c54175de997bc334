"""The HTTP rules every front shares (`controlplane.fronts._security`), on their own:
where a front may listen, which token it requires, and its ASGI guard, driven with ASGI
messages (the HTTP tests drive it through a real server)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

from controlplane import ErrorCode
from controlplane.fronts import TOKEN_ENV, Bind, guard, is_loopback, parse_bind, resolve_token
from tests.support import raises


@pytest.mark.parametrize(
    ("text", "bind"),
    [
        ("127.0.0.1:8765", Bind("127.0.0.1", 8765)),
        ("[::1]:80", Bind("::1", 80)),
        (":0", Bind("127.0.0.1", 0)),
        ("0.0.0.0:9000", Bind("0.0.0.0", 9000)),
    ],
)
def test_a_bind_reads_host_and_port(text: str, bind: Bind) -> None:
    assert parse_bind(text) == bind


@pytest.mark.parametrize("text", ["8765", "host:", "host:port", "h:70000", "h:-1"])
def test_a_malformed_bind_is_invalid_input(text: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="HOST:PORT"):
        parse_bind(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("127.0.0.2", True), ("::1", True), ("0.0.0.0", False),
     ("10.0.0.1", False), ("example.com", False)],
)  # fmt: skip
def test_only_loopback_names_and_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_loopback_bind_needs_no_token_unless_given_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert resolve_token(Bind("127.0.0.1", 0), None) == (None, None)
    assert resolve_token(Bind("127.0.0.1", 0), "t0k") == ("t0k", None)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(Bind("127.0.0.1", 0), None) == ("from-env", None)


def test_a_public_bind_without_a_token_gets_one_in_a_0600_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)

    token, path = resolve_token(Bind("0.0.0.0", 0), None, token_dir=tmp_path)

    assert token is not None
    assert len(token) >= 32
    assert path is not None
    assert path.parent == tmp_path
    assert path.read_text(encoding="utf-8").strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("token", ["", " ", "a b "])
def test_a_blank_or_padded_token_is_invalid_input(token: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="bearer token"):
        resolve_token(Bind("0.0.0.0", 0), token)


def _call(app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, int]:
    """Drive an ASGI app with one request; the status and how often the inner app ran."""
    ran = 0

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        nonlocal ran
        ran += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    asyncio.run(app(inner)(scope, receive, send))
    return sent[0]["status"], ran


def test_the_guard_refuses_a_missing_or_wrong_token_before_the_app_runs() -> None:
    app = lambda inner: guard(inner, token="t0k")  # noqa: E731

    assert _call(app, [], [b"{}"]) == (401, 0)
    assert _call(app, [(b"authorization", b"Bearer nope")], [b"{}"]) == (401, 0)
    assert _call(app, [(b"authorization", b"Bearer t0k")], [b"{}"]) == (200, 1)


def test_the_guard_refuses_a_body_over_the_cap_declared_or_streamed() -> None:
    app = lambda inner: guard(inner, token=None, max_body=10)  # noqa: E731

    assert _call(app, [(b"content-length", b"11")], [b"x" * 11]) == (413, 0)
    assert _call(app, [], [b"x" * 6, b"x" * 6]) == (413, 0)  # no length declared
    assert _call(app, [], [b"x" * 5, b"x" * 5]) == (200, 1)
