"""Protocol fronts: the control plane served to clients that speak a protocol (MCP, A2A).

A front is a front end, like the CLI: it imports the runtime, nothing below imports it.
The shared setup (open the store, register providers, register the parent session, the
flags that say how) and the HTTP rules (loopback, bearer token, loopback addressing, body
cap, JSON posts, the listening socket) live here once for every front.

Each protocol's SDK is an optional extra, imported only when that front is used:
`serve_mcp` and `mcp_front` need ``pip install 'subagent-control[mcp]'``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from controlplane.fronts._security import (
    MAX_BODY_BYTES,
    TOKEN_ENV,
    Bind,
    guard,
    is_loopback,
    parse_bind,
    resolve_token,
)
from controlplane.fronts._setup import (
    DB_ENV,
    DEFAULT_PROVIDER,
    FrontOptions,
    Opened,
    add_db_argument,
    add_front_arguments,
    add_provider_arguments,
    default_provider,
    load_setup,
    open_front,
    open_runtime,
)

if TYPE_CHECKING:
    from controlplane.contract import AgentHandle
    from controlplane.fronts._mcp_server import McpFront
    from controlplane.runtime._facade import SubagentControl

__all__ = [
    "DB_ENV",
    "DEFAULT_PROVIDER",
    "MAX_BODY_BYTES",
    "TOKEN_ENV",
    "Bind",
    "FrontOptions",
    "Opened",
    "add_db_argument",
    "add_front_arguments",
    "add_provider_arguments",
    "default_provider",
    "guard",
    "is_loopback",
    "load_setup",
    "mcp_front",
    "open_front",
    "open_runtime",
    "parse_bind",
    "resolve_token",
    "serve_mcp",
]


def serve_mcp(
    options: FrontOptions,
    *,
    http: str | None = None,
    token: str | None = None,
    out: TextIO,
    token_dir: Path | None = None,
) -> None:
    """Serve MCP (stdio, or streamable HTTP at ``http``) until stopped; see
    ``subagent-control mcp --help``.

    Raises:
        ImportError: the ``mcp`` extra is not installed (the message says how to add it).
    """
    _require_mcp("subagent-control mcp")
    from controlplane.fronts._mcp_serve import serve_mcp as serve

    serve(options, http=http, token=token, out=out, token_dir=token_dir)


def mcp_front(control: SubagentControl, parent: AgentHandle, *, provider: str) -> McpFront:
    """An MCP server (``.server``, an ``mcp`` low-level ``Server``) acting as ``parent``.

    Raises:
        ImportError: the ``mcp`` extra is not installed.
    """
    _require_mcp("controlplane.fronts.mcp_front")
    from controlplane.fronts._mcp_server import McpFront

    return McpFront(control, parent, provider=provider)


def _require_mcp(needed_by: str) -> None:
    try:
        importlib.import_module("mcp")
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs the optional 'mcp' package: pip install 'subagent-control[mcp]'"
        ) from exc
