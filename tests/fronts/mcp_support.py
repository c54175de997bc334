"""Helpers the MCP front's tests share: bounded client conversations, the HTTP server
subprocess, and the text of a tool result."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.reliability.processes import LinesProcess, Reaper

T = TypeVar("T")


SETUP = "tests.fronts.scripted_setup"
CALL_S = 30.0
"""The bound on one test's whole client conversation."""


def run(conversation: Callable[[], Awaitable[T]], timeout_s: float = CALL_S) -> T:
    """Run an async client conversation to its end, within ``timeout_s``."""
    import anyio  # comes with the mcp extra

    async def bounded() -> T:
        with anyio.fail_after(timeout_s):
            return await conversation()

    return anyio.run(bounded)


def cli_command() -> list[str]:
    """The ``subagent-control`` console script, run by this interpreter."""
    script = Path(sys.executable).with_name("subagent-control")
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "controlplane.cli"]


class HttpServer:
    """``subagent-control mcp --http BIND`` as a subprocess; ``url`` once it serves."""

    def __init__(
        self, reaper: Reaper, db: str, *args: str, setup: str = "echo", bind: str = "127.0.0.1:0"
    ) -> None:
        command = cli_command()
        self.process = reaper.add(
            LinesProcess(
                Path(command[1]),
                *command[2:],
                "mcp", "--db", db, "--setup", f"{SETUP}:{setup}",
                "--http", bind, *args,
                name="mcp-http",
            )
        )  # fmt: skip
        self.url = self.process.expect("serving MCP at ")

    def kill(self) -> None:
        """SIGKILL it and wait until it is gone."""
        self.process.reap()


def text_of(result: Any) -> str:
    """The one text block of a tool result."""
    (block,) = result.content
    return str(block.text)


class RawStdio:
    """``subagent-control mcp`` over stdio, spoken by hand: one JSON-RPC message per line.

    For what the SDK's client cannot send or read (the 2025-11-25 task-augmented
    ``tools/call``); reaped by ``reaper`` pass or fail.
    """

    def __init__(self, reaper: Reaper, db: str, *, setup: str = "echo") -> None:
        command = cli_command()
        self.process = reaper.add(
            LinesProcess(
                Path(command[1]), *command[2:], "mcp", "--db", db, "--setup", f"{SETUP}:{setup}",
                name="mcp-stdio",
            )
        )  # fmt: skip
        self._next_id = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its response (result or error), skipping notifications."""
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.process.say(json.dumps(message))
        for _ in range(100):  # bounded: notifications in between are few
            answer: dict[str, Any] = json.loads(self.process.next_line())
            if answer.get("id") == self._next_id:
                return answer
        raise AssertionError(f"no answer to {method}")

    def initialize(self, capabilities: dict[str, Any]) -> dict[str, Any]:
        """The 2025-11-25 handshake; the server's ``initialize`` result."""
        params = {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "0"},
        }
        result = self.request("initialize", params)["result"]
        self.process.say(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        return dict(result)
