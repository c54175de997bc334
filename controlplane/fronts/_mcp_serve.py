"""Serving the MCP front: over stdio (one client, the process's stdin and stdout) or over
streamable HTTP behind `controlplane.fronts._security.guard`.

The control plane is opened before serving and closed after, whatever ended the serving
(the client closing stdin, SIGINT or SIGTERM to the HTTP server, an error).
"""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path
from typing import TextIO

import anyio
import uvicorn

from controlplane.fronts._http_limits import LimitedH11
from controlplane.fronts._mcp_server import McpFront
from controlplane.fronts._mcp_stdio import serve_stdio
from controlplane.fronts._security import (
    MAX_BODY_BYTES,
    ASGIApp,
    Bind,
    announce_token,
    guard,
    is_loopback,
    listen,
    parse_bind,
    resolve_token,
)
from controlplane.fronts._setup import FrontOptions, open_front

__all__ = ["MCP_PATH", "http_app", "serve_mcp"]

MCP_PATH = "/mcp"
_GRACEFUL_S = 5  # open streams get this long to finish when the server stops


def serve_mcp(
    options: FrontOptions,
    *,
    http: str | None,
    token: str | None,
    out: TextIO,
    token_dir: Path | None = None,
) -> None:
    """Open the control plane, serve MCP until told to stop, close it.

    Args:
        options: The store, parent session and providers.
        http: ``HOST:PORT`` to serve streamable HTTP on; None serves stdio.
        token: The bearer token HTTP clients must send (else `TOKEN_ENV`, else generated
            when the bind is not loopback).
        out: Where an HTTP server prints its URL (and its token file); stdio prints
            nothing, its stdout is the protocol.
        token_dir: Where a generated token file goes (the temporary directory by default).
    """
    bind = parse_bind(http) if http is not None else None  # a typo fails before the store opens
    opened = open_front(options)
    try:
        front = McpFront(opened.control, opened.parent, provider=opened.provider)
        if bind is None:
            anyio.run(serve_stdio, front)
        else:
            required, token_file = resolve_token(bind, token, token_dir=token_dir)
            sock = listen(bind)
            try:
                anyio.run(_serve_http, front, bind, sock, required, token_file, out)
            finally:
                sock.close()
    finally:
        opened.control.close()


def http_app(front: McpFront, bind: Bind, token: str | None) -> ASGIApp:
    """The guarded ASGI app of ``front`` for a server at ``bind``."""
    app = front.server.streamable_http_app(
        streamable_http_path=MCP_PATH, host=bind.host, max_request_body_size=MAX_BODY_BYTES
    )
    return guard(app, token=token, loopback=is_loopback(bind.host))


async def _serve_http(
    front: McpFront,
    bind: Bind,
    sock: socket.socket,
    token: str | None,
    token_file: Path | None,
    out: TextIO,
) -> None:
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        http_app(front, bind, token),
        log_level="warning",
        http=LimitedH11,
        lifespan="on",
        timeout_graceful_shutdown=_GRACEFUL_S,
    )
    server = uvicorn.Server(config)
    print(f"serving MCP at http://{bind.url_host}:{port}{MCP_PATH}", file=out, flush=True)
    announce_token(bind, token_file, out)
    # uvicorn stops on SIGTERM, then raises it again under the handler it found: ours
    # absorbs it, so the caller still closes the control plane (Tasks settle `killed`).
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _absorb) if main else None
    try:
        await server.serve(sockets=[sock])
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _absorb(_signum: int, _frame: object) -> None:
    """A SIGTERM after uvicorn's graceful stop: nothing left to do but return."""
