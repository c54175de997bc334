"""Serving MCP over stdio in a way a signal can stop.

The SDK reads stdin on a worker thread that no cancellation reaches: a server asked to stop
(SIGTERM) while its client keeps stdin open would hang until the client closes it. Read
from a pipe, stdin is read here on the event loop instead, so SIGTERM and SIGINT cancel the
serving, the caller closes the control plane, and the process exits. (A stdin that is no
pipe, such as a file, is left to the SDK: it ends on its own at end of file.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
from typing import Any, Final, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCError
from pydantic import ValidationError

from controlplane.fronts._mcp_server import McpFront

__all__ = ["serve_stdio"]

log = logging.getLogger("controlplane.fronts.mcp")

_MAX_LINE: Final = 64 * 1024 * 1024  # one JSON-RPC message per line; a tool message is ≤ 1 MB


class _PipeLines:
    """stdin's lines, read on the event loop (cancellable), as the SDK's reader iterates."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


async def serve_stdio(front: McpFront) -> None:
    """Serve ``front`` on stdin/stdout until the client closes stdin, or SIGTERM/SIGINT."""
    stdin = await _pipe_lines()
    async with anyio.create_task_group() as group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    group.cancel_scope.cancel()
                    return

        async def serve() -> None:
            async with (
                stdio_server(stdin=cast(Any, stdin)) as (read_stream, write_stream),
                anyio.create_task_group() as relaying,
            ):
                parsed, parsed_reader = anyio.create_memory_object_stream[
                    SessionMessage | Exception
                ](0)
                relaying.start_soon(_answer_unparseable, read_stream, parsed, write_stream)
                await front.server.run(
                    parsed_reader, write_stream, front.server.create_initialization_options()
                )
            group.cancel_scope.cancel()  # the client closed stdin: stop listening for signals

        group.start_soon(stop_on_signal)
        group.start_soon(serve)


async def _answer_unparseable(
    lines: MemoryObjectReceiveStream[SessionMessage | Exception],
    parsed: MemoryObjectSendStream[SessionMessage | Exception],
    replies: MemoryObjectSendStream[SessionMessage],
) -> None:
    """Pass the messages on; answer a line that is no JSON-RPC message with a parse error.

    The SDK drops such a line silently over stdio (over HTTP it answers -32700); JSON-RPC
    asks for an error response with a null id, so a client learns its line was refused.
    """
    async with parsed:
        async for item in lines:
            if isinstance(item, Exception):
                error = _error_for(item)
                await replies.send(
                    SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error))
                )
                continue
            _log_request(item)
            await parsed.send(item)


def _log_request(item: SessionMessage) -> None:
    """One line per request from the client (``-v``), as the HTTP fronts log theirs."""
    if not log.isEnabledFor(logging.INFO):
        return
    message: Any = item.message
    method = getattr(message, "method", None)
    if method is None or getattr(message, "id", None) is None:
        return  # a response or a notification: not a request
    params = getattr(message, "params", None) or {}
    name = params.get("name") if isinstance(params, dict) else None
    log.info("stdio %s%s", method, f" {name}" if isinstance(name, str) else "")


def _error_for(exc: Exception) -> types.ErrorData:
    # Not JSON at all is a parse error; JSON that is no JSON-RPC message an invalid request.
    if isinstance(exc, ValidationError) and all(e["type"] != "json_invalid" for e in exc.errors()):
        return types.ErrorData(
            code=types.INVALID_REQUEST, message="Invalid Request: not a JSON-RPC message"
        )
    return types.ErrorData(code=types.PARSE_ERROR, message="Parse error: not JSON")


async def _pipe_lines() -> _PipeLines | None:
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_LINE)
    # A private duplicate: the pipe transport owns (and closes) what it is given.
    pipe = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return _PipeLines(reader)
