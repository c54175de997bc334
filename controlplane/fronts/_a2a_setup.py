"""What the A2A front needs around it: the control plane opened from the command line, the
parent session its clients act as, and the HTTP rules (loopback by default, a bearer token
otherwise, capped request bodies).

Each function is small and says nothing about A2A, so the fronts' shared setup can take it
over as it is (``open_control``, ``load_setup``, ``register_openai``, ``register_parent``
and ``start_provider`` the setup; ``parse_bind`` to `HttpGuard` the security rules).
"""

from __future__ import annotations

import hmac
import importlib
import ipaddress
import json
import os
import secrets
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import AgentHandle, ErrorCode, SubagentControlError

if TYPE_CHECKING:
    from controlplane._facade import SubagentControl

__all__ = [
    "MAX_BODY_BYTES",
    "HttpGuard",
    "bearer_token",
    "is_loopback",
    "load_setup",
    "open_control",
    "parse_bind",
    "register_openai",
    "register_parent",
    "start_provider",
]

MAX_BODY_BYTES: Final = 1 << 20
"""The default cap on a request body: a message's text is at most 100,000 characters."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- the control plane and its parent ---------------------------------------------------------


def open_control(db: str) -> SubagentControl:
    """Open the control plane on the store at ``db`` (``sqlite:///…``, ``postgresql+…``)."""
    from controlplane._facade import SubagentControl

    return SubagentControl.open(db)


def load_setup(target: str) -> Callable[[SubagentControl], object]:
    """The function ``MODULE:FUNCTION`` names (importable from the current directory too).

    Raises:
        SubagentControlError: ``INVALID_INPUT``: not of that form, not importable, or not
            a callable.
    """
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup takes MODULE:FUNCTION, not {target!r}"
        )
    # The console script's sys.path starts at its own directory, not the caller's.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup: cannot import {module_name!r}: {exc}"
        ) from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup: {module_name!r} has no function {name!r}"
        )
    return function  # type: ignore[no-any-return]


def register_openai(control: SubagentControl, *, model: str, base_url: str | None) -> None:
    """Register an `InProcessProvider` (``inprocess``) on `OpenAIChatModel` (the ``openai``
    extra; the key comes from ``OPENAI_API_KEY``)."""
    from controlplane.models import OpenAIChatModel
    from controlplane.providers import InProcessProvider

    control.providers.register(InProcessProvider(OpenAIChatModel(model, base_url=base_url)))


def register_parent(control: SubagentControl, session: str) -> AgentHandle:
    """Register the parent session the front's clients act as.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for an empty id; ``OWNERSHIP_CONFLICT``
            if it is already live in this process.
    """
    return control.agents.register(session)


def start_provider(control: SubagentControl) -> str:
    """The provider new children start on: the only one registered, else ``inprocess``.

    Raises:
        SubagentControlError: ``UNKNOWN_PROVIDER`` when none is registered, or several
            and none is ``inprocess``.
    """
    names = control.providers.names()
    if len(names) == 1:
        return names[0]
    if "inprocess" in names:
        return "inprocess"
    raise SubagentControlError(
        ErrorCode.UNKNOWN_PROVIDER,
        f"no provider to start children on (registered: {names or 'none'}); register one "
        "with --setup MODULE:FUNCTION or --openai-model NAME",
    )


# -- binding and tokens -------------------------------------------------------------------------


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one) as host and port.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for anything else.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--http takes HOST:PORT (e.g. 127.0.0.1:8000), not {text!r}"
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token(host: str, *, token: str | None, token_file: Path) -> str | None:
    """The token clients must present, or None when none is needed.

    A loopback bind needs none unless ``token`` is given. Any other bind needs one: the
    given one, else a new one written to ``token_file`` (mode 0600, replaced).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a blank token or a file that cannot be
            written.
    """
    if token is not None:
        if not token.strip() or not token.isascii() or any(c.isspace() for c in token):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "--token must be printable ASCII without spaces"
            )
        return token
    if is_loopback(host):
        return None
    fresh = secrets.token_urlsafe(32)
    try:
        # O_NOFOLLOW: never write the secret through a link someone planted there.
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            os.fchmod(out.fileno(), 0o600)  # an existing file keeps its mode otherwise
            out.write(fresh + "\n")
    except OSError as exc:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"cannot write the token file {token_file}: {exc}"
        ) from exc
    return fresh


# -- the HTTP guard -----------------------------------------------------------------------------


class HttpGuard:
    """ASGI middleware that checks a request before the application sees a byte of it.

    - A bearer token on every path but ``open_paths`` (401 without it).
    - On a loopback server, a ``Host`` naming this machine (403 otherwise): a web page
      cannot reach it through a DNS name rebound to 127.0.0.1.
    - A POST's body is JSON (``Content-Type: application/json``, else 415): a web page's
      form or ``text/plain`` post, which a browser sends cross-origin without asking, is
      refused.
    - A cap on the body (413). The body is read here (at most ``max_body`` bytes) and
      handed on whole, so a chunked body past the cap is refused as surely as a declared
      one.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        loopback: bool,
        max_body: int = MAX_BODY_BYTES,
        open_paths: frozenset[str] = frozenset(),
    ) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode() if token is not None else None
        self._loopback = loopback
        self._max_body = max_body
        self._open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if self._expected is not None and scope.get("path") not in self._open_paths:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _refuse(send, 401, "a valid bearer token is required", bearer=True)
                return
        if self._loopback and not is_loopback(_host_name(headers.get(b"host", b""))):
            await _refuse(send, 403, "this server answers only requests addressed to loopback")
            return
        if scope.get("method") == "POST":
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                await _refuse(send, 415, "the request body must be application/json")
                return
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max_body):
            await _refuse(send, 413, f"the request body is over {self._max_body} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self._max_body:
                await _refuse(send, 413, f"the request body is over {self._max_body} bytes")
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # after the body: the client's disconnect, for a stream's end
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self._app(scope, replay, send)


def _host_name(host: bytes) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:80`` → ``::1``)."""
    text = host.decode("latin-1")
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.rpartition(":")[0] if text.count(":") == 1 else text


async def _refuse(send: Send, status: int, message: str, *, bearer: bool = False) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if bearer:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
