"""The rules every HTTP front enforces before a request reaches its protocol: where it may
listen, who may call it, and what a request may send.

- Loopback by default. A bind to any other address serves only with a bearer token: the
  one given (``--token`` or `TOKEN_ENV`), else a fresh one written to a new 0600 file in
  the temporary directory, whose path is printed, so an operator copies it without it
  ever appearing in ``ps`` (a fresh file each time: two servers never share or overwrite
  one, and nothing is written through a link planted at a known path).
- A request without the token, or with a wrong one, is answered 401 before its body is
  read (``open_paths`` excepted: a card that says how to authenticate).
- A loopback server answers only requests addressed to loopback: a ``Host`` (or an
  ``Origin``) naming another machine is answered 403, so a web page cannot reach it
  through a DNS name rebound to 127.0.0.1.
- A body over the cap is answered 413; one nested deeper than `MAX_JSON_DEPTH` 400 with
  JSON-RPC's parse error (a parser would recurse past Python's limit); a POST with a body
  that is not ``application/json`` 415 (a web page's form or text post, which a browser sends
  cross-origin without asking first). None of them changes anything.
- A body that does not arrive within `BODY_S` is answered 408 (the head's deadline and
  the cap on one client's half-sent connections: `controlplane.fronts._http_limits`).
- The listening socket sets ``TCP_NODELAY``, inherited by every accepted connection.

`guard` is plain ASGI and `listen` a plain socket, so the MCP front (Starlette) and the
A2A front share them.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import urlsplit

from controlplane.contract import ErrorCode, SubagentControlError

log = logging.getLogger("controlplane.fronts.http")

__all__ = [
    "DEFAULT_HOST",
    "MAX_BODY_BYTES",
    "TOKEN_ENV",
    "ASGIApp",
    "Bind",
    "announce_token",
    "guard",
    "is_loopback",
    "listen",
    "parse_bind",
    "resolve_token",
]

DEFAULT_HOST: Final = "127.0.0.1"
MAX_BODY_BYTES: Final = 1024 * 1024
"""The largest request body an HTTP front reads (1 MiB): a full-size tool message fits."""
MAX_JSON_DEPTH: Final = 200
"""The deepest nesting of arrays and objects a request body may have (the protocols' own
messages nest a dozen levels)."""
_PARSE_ERROR: Final = -32700
BODY_S: Final = 30.0
"""How long a request's body may take to arrive once its head has (408 past that; the
head's own deadline is `controlplane.fronts._http_limits`)."""
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
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (loopback) as a `Bind`; port 0 picks one.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for anything else.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    port = int(port_text) if port_text.isdigit() else -1
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
        SubagentControlError: ``INVALID_INPUT`` for a token that is empty, or not printable
            ASCII without spaces (it could not travel in an ``Authorization`` header).
    """
    token = given if given is not None else os.environ.get(TOKEN_ENV)
    if token is not None:
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"the bearer token (--token or ${TOKEN_ENV}) must be printable ASCII "
                "without spaces",
            )
        return token, None
    if is_loopback(bind.host):
        return None, None
    token = secrets.token_urlsafe(32)
    # mkstemp creates the file 0600 and exclusively: nobody reads it between write and chmod,
    # and no link planted at a guessed name is followed.
    fd, name = tempfile.mkstemp(prefix="subagent-control-token-", dir=token_dir)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    return token, Path(name)


def listen(bind: Bind) -> socket.socket:
    """A socket bound to ``bind`` and listening, so a front's URL carries its real port
    (``:0`` picks one) and early clients queue until it serves.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` naming the bind when it cannot listen there
            (in use, not an address of this machine, not allowed).
    """
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Inherited by every accepted connection (asyncio sets it only on sockets it made
        # itself). Without it a keep-alive client waits out its delayed ACK (40 ms) on each
        # answer, which the server writes in two parts (headers, body).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((bind.host, bind.port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"cannot listen on {bind.url_host}:{bind.port}: {exc.strerror or exc}",
        ) from exc
    return sock


def announce_token(bind: Bind, token_file: Path | None, out: IO[str]) -> None:
    """Print where a generated token went (on ``out``, after the front's URL line), and
    warn on stderr when the front serves beyond this machine."""
    if token_file is not None:
        print(f"bearer token written to {token_file}", file=out, flush=True)
    if not is_loopback(bind.host):
        print(f"serving beyond this machine on {bind.host}", file=sys.stderr, flush=True)


def guard(
    app: ASGIApp,
    *,
    token: str | None,
    loopback: bool,
    max_body: int = MAX_BODY_BYTES,
    open_paths: frozenset[str] = frozenset(),
) -> ASGIApp:
    """Wrap an ASGI app in the HTTP rules (see the module): bearer token (when ``token``
    is set, on every path but ``open_paths``), loopback addressing (when ``loopback``),
    the body cap, JSON posts.

    The body is read whole (up to ``max_body``) before ``app`` sees the request, so a
    chunked body past the cap is refused as surely as a declared one, before anything
    parses it.
    """
    # Imported by a server being built, not by the command line that only reads its flags.
    import asyncio

    expected = f"Bearer {token}".encode() if token is not None else None

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        # One line per request (``-v``): method, path, status, time; never a body.
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await guarded(scope, receive, send)
            return
        status = 0
        began = time.monotonic()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await guarded(scope, receive, sending)
        finally:
            log.info(
                "%s %s %s %.0f ms", scope.get("method"), scope.get("path"), status or "-",
                (time.monotonic() - began) * 1000,
            )  # fmt: skip

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {bytes(name).lower(): bytes(value) for name, value in scope.get("headers", ())}
        if not _authorized(scope, headers, expected, open_paths):
            await _refuse(send, 401, "missing or wrong bearer token", auth=True)
            return
        if loopback and not _addressed_to_loopback(headers):
            await _refuse(send, 403, "this server answers only requests addressed to loopback")
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > max_body:
            await _refuse(send, 413, f"request body over {max_body} bytes")
            return
        body = bytearray()
        more = True
        body_by = asyncio.get_running_loop().time() + BODY_S
        while more:
            try:
                message = await asyncio.wait_for(
                    receive(), body_by - asyncio.get_running_loop().time()
                )
            except TimeoutError:
                await _refuse(send, 408, f"the request body did not arrive within {BODY_S:g}s")
                return
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > max_body:
                await _refuse(send, 413, f"request body over {max_body} bytes")
                return
            more = bool(message.get("more_body", False))
        # Only a POST that carries a body: a GET (an SSE stream) or an empty POST has
        # nothing to parse.
        if scope.get("method") == "POST" and body and not _is_json(headers):
            await _refuse(send, 415, "the request body must be application/json")
            return
        if _nested_deeper(bytes(body), MAX_JSON_DEPTH):
            # A parser would recurse past Python's limit (a protocol SDK then answers an
            # internal error): refused as the parse error it is, before anything parses it.
            await _refuse(
                send, 400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels",
                code=_PARSE_ERROR,
            )  # fmt: skip
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # after the body: the client's disconnect, for a stream's end
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await app(scope, replay, send)

    return logged


def _authorized(
    scope: Scope, headers: dict[bytes, bytes], expected: bytes | None, open_paths: frozenset[str]
) -> bool:
    if expected is None or scope.get("path") in open_paths:
        return True
    return hmac.compare_digest(headers.get(b"authorization", b""), expected)


def _addressed_to_loopback(headers: dict[bytes, bytes]) -> bool:
    if not is_loopback(_host_name(headers.get(b"host", b""))):
        return False
    origin = headers.get(b"origin")  # sent by browsers only; absent for other clients
    if origin is None:
        return True
    try:
        return is_loopback(urlsplit(origin.decode("latin-1")).hostname or "")
    except ValueError:
        return False


def _host_name(host: bytes) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:80`` → ``::1``)."""
    text = host.decode("latin-1")
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.rpartition(":")[0] if text.count(":") == 1 else text


def _is_json(headers: dict[bytes, bytes]) -> bool:
    kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    return kind == b"application/json"


def _nested_deeper(body: bytes, limit: int) -> bool:
    """Whether the JSON text ``body`` opens more than ``limit`` arrays or objects at once
    (brackets inside strings do not count)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the common case, at C speed
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


async def _refuse(
    send: Send, status: int, message: str, *, auth: bool = False, code: int = -32600
) -> None:
    # A JSON-RPC error body, so a protocol client reads a reason and not only a status.
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth:
        headers.append((b"www-authenticate", b'Bearer realm="subagent-control"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
