"""The rules every HTTP front enforces before a request reaches its protocol: where it may
listen, who may call it, and how much a request may send.

- Loopback by default. A bind to any other address serves only with a bearer token: the
  one given (``--token`` or `TOKEN_ENV`), else a fresh one written to a 0600 file whose
  path is printed, so an operator copies it without it ever appearing in ``ps``.
- A request without the token, or with a wrong one, is answered 401 before its body is
  read; a body over the cap is answered 413. Both change nothing.

`guard` is plain ASGI, so the MCP front (Starlette) and the A2A front share it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from controlplane.contract import ErrorCode, SubagentControlError

__all__ = [
    "DEFAULT_HOST",
    "MAX_BODY_BYTES",
    "TOKEN_ENV",
    "ASGIApp",
    "Bind",
    "guard",
    "is_loopback",
    "parse_bind",
    "resolve_token",
]

DEFAULT_HOST: Final = "127.0.0.1"
MAX_BODY_BYTES: Final = 1024 * 1024
"""The largest request body an HTTP front reads (1 MiB): a full-size tool message fits."""
TOKEN_ENV: Final = "SUBAGENT_CONTROL_TOKEN"
"""The environment variable a front reads its bearer token from when ``--token`` is not given."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Bind:
    """Where an HTTP front listens."""

    host: str
    port: int

    @property
    def url_host(self) -> str:
        """The host as it appears in a URL (IPv6 in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_bind(text: str) -> Bind:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (loopback) as a `Bind`.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for anything else.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not 0 <= port <= 65535:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"--http must read HOST:PORT (e.g. 127.0.0.1:8765), not {text!r}",
        )
    return Bind(host=host, port=port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def resolve_token(
    bind: Bind, given: str | None, *, token_dir: Path | None = None
) -> tuple[str | None, Path | None]:
    """The bearer token a front at ``bind`` requires, and the file it was written to.

    ``given`` (``--token``) wins, then `TOKEN_ENV`. On loopback with neither, no token is
    required. Elsewhere a fresh token is generated into a new 0600 file in ``token_dir``
    (the temporary directory by default); its path is returned for the operator.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for an empty or blank token.
    """
    token = given if given is not None else os.environ.get(TOKEN_ENV)
    if token is not None:
        if not token.strip() or token != token.strip():
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "the bearer token must be non-empty, without spaces"
            )
        return token, None
    if is_loopback(bind.host):
        return None, None
    token = secrets.token_urlsafe(32)
    # mkstemp creates the file 0600 and exclusively: nobody reads it between write and chmod.
    fd, name = tempfile.mkstemp(prefix="subagent-control-token-", dir=token_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token, Path(name)


def guard(app: ASGIApp, *, token: str | None, max_body: int = MAX_BODY_BYTES) -> ASGIApp:
    """Wrap an ASGI app: bearer token (when ``token`` is set), then the body cap.

    The body is read whole (up to ``max_body``) before ``app`` sees the request, so an
    oversized request is refused before anything parses it.
    """
    expected = f"Bearer {token}".encode() if token is not None else None

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if expected is not None and not _authorized(scope, expected):
            await _refuse(send, 401, "missing or wrong bearer token", auth=True)
            return
        declared = _content_length(scope)
        if declared is not None and declared > max_body:
            await _refuse(send, 413, f"request body over {max_body} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                await _refuse(send, 413, f"request body over {max_body} bytes")
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: the disconnect, when it comes

        await app(scope, replay, send)

    return guarded


def _authorized(scope: Scope, expected: bytes) -> bool:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            return hmac.compare_digest(bytes(value), expected)
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, status: int, message: str, *, auth: bool = False) -> None:
    # A JSON-RPC error body, so a protocol client reads a reason and not only a status.
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth:
        headers.append((b"www-authenticate", b'Bearer realm="subagent-control"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
