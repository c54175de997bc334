"""The HTTP rules every front shares (`controlplane.fronts._security`), on their own:
where a front may listen, which token it requires, and its ASGI guard, driven with ASGI
messages (the HTTP tests of each front drive it through a real server)."""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from controlplane import ErrorCode
from controlplane.fronts import TOKEN_ENV, Bind, guard, is_loopback, parse_bind, resolve_token
from controlplane.fronts._security import listen
from tests.fronts.mcp_support import SETUP
from tests.support import raises, run_python

LOOPBACK_HOST = [(b"host", b"127.0.0.1:8000")]
JSON = [*LOOPBACK_HOST, (b"content-type", b"application/json")]


@pytest.mark.parametrize(
    ("text", "bind"),
    [
        ("127.0.0.1:8765", Bind("127.0.0.1", 8765)),
        ("[::1]:80", Bind("::1", 80)),
        (":0", Bind("127.0.0.1", 0)),
        ("0.0.0.0:9000", Bind("0.0.0.0", 9000)),
        ("host:1", Bind("host", 1)),
    ],
)
def test_a_bind_reads_host_and_port(text: str, bind: Bind) -> None:
    assert parse_bind(text) == bind


@pytest.mark.parametrize("text", ["8765", "host:", "host:port", "h:70000", "h:-1", "h:+1"])
def test_a_malformed_bind_is_invalid_input(text: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="HOST:PORT"):
        parse_bind(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("127.0.0.2", True), ("127.8.9.10", True), ("::1", True),
     ("0.0.0.0", False), ("10.0.0.1", False), ("example.com", False)],
)  # fmt: skip
def test_only_loopback_names_and_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_loopback_bind_needs_no_token_unless_given_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert resolve_token(Bind("127.0.0.1", 0), None, token_dir=tmp_path) == (None, None)
    assert resolve_token(Bind("127.0.0.1", 0), "t0k") == ("t0k", None)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(Bind("127.0.0.1", 0), None) == ("from-env", None)
    assert list(tmp_path.iterdir()) == []


def test_a_public_bind_without_a_token_gets_one_in_a_new_0600_file_each_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two servers never share a token file: neither overwrites the other's token."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)

    token, path = resolve_token(Bind("0.0.0.0", 0), None, token_dir=tmp_path)
    other, other_path = resolve_token(Bind("0.0.0.0", 0), None, token_dir=tmp_path)

    assert token is not None
    assert len(token) >= 32
    assert path is not None
    assert path.parent == tmp_path
    assert path.read_text(encoding="utf-8").strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert other != token
    assert other_path != path


@pytest.mark.parametrize("token", ["", " ", "a b ", "has space", "tab\there", "naïve"])
def test_a_blank_padded_or_unprintable_token_is_invalid_input(token: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="--token"):
        resolve_token(Bind("0.0.0.0", 0), token)


def test_the_listening_socket_answers_without_waiting_for_delayed_acks() -> None:
    """TCP_NODELAY on the listening socket is inherited by each accepted connection."""
    with (
        listen(Bind("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname(), timeout=5),
    ):
        server.settimeout(5)
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_bind_it_cannot_listen_on_is_invalid_input_naming_it() -> None:
    with listen(Bind("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with raises(ErrorCode.INVALID_INPUT, match=f"cannot listen on 127.0.0.1:{port}"):
            listen(Bind("127.0.0.1", port))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("front", ["mcp", "a2a"])
@pytest.mark.slow  # measured: 14 s under load (--durations)
def test_a_port_in_use_is_a_usage_error_that_names_it(front: str, sqlite_url: str) -> None:
    """The real command, for each front: exit 2, the bind named, no traceback."""
    if front == "a2a":
        pytest.importorskip("a2a", reason="the A2A front needs the 'a2a' extra")
    with listen(Bind("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_python(
            "-m", "controlplane.cli", front, "--db", sqlite_url, "--http", f"127.0.0.1:{port}",
            "--setup", f"{SETUP}:echo", timeout=60.0,
        )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def _call(
    app: Any,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    *,
    method: str = "POST",
    path: str = "/mcp",
) -> tuple[int, int]:
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

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(app(inner)(scope, receive, send))
    return sent[0]["status"], ran


def test_the_guard_refuses_a_missing_or_wrong_token_before_the_app_runs() -> None:
    app = lambda inner: guard(inner, token="t0k", loopback=True)  # noqa: E731

    assert _call(app, JSON, [b"{}"]) == (401, 0)
    assert _call(app, [*JSON, (b"authorization", b"Bearer nope")], [b"{}"]) == (401, 0)
    assert _call(app, [*JSON, (b"authorization", b"Bearer t0k")], [b"{}"]) == (200, 1)


def test_an_open_path_needs_no_token() -> None:
    card = "/.well-known/agent-card.json"
    app = lambda inner: guard(inner, token="t0k", loopback=True, open_paths=frozenset({card}))  # noqa: E731

    assert _call(app, LOOPBACK_HOST, [b""], method="GET", path=card) == (200, 1)
    assert _call(app, LOOPBACK_HOST, [b""], method="GET", path="/other") == (401, 0)


def test_the_guard_refuses_a_body_over_the_cap_declared_or_streamed() -> None:
    app = lambda inner: guard(inner, token=None, loopback=True, max_body=10)  # noqa: E731

    assert _call(app, [*JSON, (b"content-length", b"11")], [b"x" * 11]) == (413, 0)
    assert _call(app, JSON, [b"x" * 6, b"x" * 6]) == (413, 0)  # no length declared
    assert _call(app, JSON, [b"x" * 5, b"x" * 5]) == (200, 1)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(b"host", b"127.0.0.1:8000")], 200),
        ([(b"host", b"localhost")], 200),
        ([(b"host", b"[::1]:8000")], 200),
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"http://localhost:3000")], 200),
        ([(b"host", b"rebound.example:8000")], 403),
        ([(b"host", b"rebound.example")], 403),
        ([], 403),  # no Host at all: not known to be addressed here
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"https://evil.example")], 403),
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"null")], 403),
    ],
)
def test_a_loopback_server_answers_only_requests_addressed_to_loopback(
    headers: list[tuple[bytes, bytes]], status: int
) -> None:
    """A DNS name rebound to 127.0.0.1 (or a page of another origin) reaches nothing."""
    app = lambda inner: guard(inner, token=None, loopback=True)  # noqa: E731

    assert _call(app, headers, [b""], method="GET") == (status, 1 if status == 200 else 0)


def test_a_server_beyond_loopback_takes_any_host() -> None:
    app = lambda inner: guard(inner, token="t0k", loopback=False)  # noqa: E731
    headers = [(b"host", b"server.example:8000"), (b"authorization", b"Bearer t0k")]

    assert _call(app, headers, [b""], method="GET") == (200, 1)


@pytest.mark.parametrize(
    ("method", "content_type", "chunks", "status"),
    [
        ("POST", b"application/json", [b"{}"], 200),
        ("POST", b"Application/JSON; charset=utf-8", [b"{}"], 200),
        ("POST", b"text/plain", [b"{}"], 415),
        ("POST", b"application/x-www-form-urlencoded", [b"a=1"], 415),
        ("POST", None, [b"{}"], 415),
        ("POST", None, [b""], 200),  # no body, nothing to parse
        ("GET", None, [b""], 200),  # an SSE stream's GET
        ("DELETE", None, [b""], 200),  # an MCP session's end
    ],
)
def test_only_a_post_with_a_body_must_be_json(
    method: str, content_type: bytes | None, chunks: list[bytes], status: int
) -> None:
    """A web page's form or text post, which a browser sends cross-origin without a
    preflight, is refused; requests without a body are not asked for a type."""
    app = lambda inner: guard(inner, token=None, loopback=True)  # noqa: E731
    headers = [*LOOPBACK_HOST]
    if content_type is not None:
        headers.append((b"content-type", content_type))

    assert _call(app, headers, chunks, method=method) == (status, 1 if status == 200 else 0)


def test_a_body_that_does_not_arrive_in_time_is_answered_408_before_the_app_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client that sends its head and trickles (or never sends) its body held the
    # request, and its connection, for as long as it liked.
    monkeypatch.setattr("controlplane.fronts._security.BODY_S", 0.05)
    sent: list[dict[str, Any]] = []
    ran = 0

    async def inner(_scope: Any, _receive: Any, _send: Any) -> None:
        nonlocal ran
        ran += 1

    async def never() -> dict[str, Any]:
        await asyncio.Event().wait()  # the body never comes (cancelled by the deadline)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": JSON}
    asyncio.run(guard(inner, token=None, loopback=True)(scope, never, send))
    assert (sent[0]["status"], ran) == (408, 0)
