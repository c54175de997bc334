"""How an MCP server process starts and ends: a bad command line fails before anything is
opened, and SIGTERM ends a server (stdio or HTTP) through ``control.close()``, so its
running Tasks settle ``killed`` instead of being left for another runtime to interrupt."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from controlplane import SubagentControl, TaskStatus
from tests.fronts.mcp_support import SETUP, HttpServer, RawStdio, cli_command, run, text_of
from tests.fronts.test_mcp_http import _client
from tests.reliability.processes import LinesProcess, Reaper
from tests.support import run_python

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

EXIT_S = 30.0


def _status(url: str, task_id: str) -> TaskStatus:
    with SubagentControl.open(url) as control:
        return control.tasks.get(task_id, requester="mcp").status


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--setup", "no_such_module:fn"], "cannot import 'no_such_module'"),
        (["--setup", "nocolon"], "--setup must read MODULE:FUNCTION"),
        (["--setup", f"{SETUP}:missing"], "has no function 'missing'"),
        (["--http", "localhost:http"], "--http must read HOST:PORT"),
        (["--setup", f"{SETUP}:echo", "--openai-model", "m"], "not both"),
    ],
)
@pytest.mark.slow  # measured: 7 s under load (--durations)
def test_a_bad_command_line_exits_2_and_creates_no_store(
    tmp_path: Path, args: list[str], says: str
) -> None:
    db = tmp_path / "state.db"

    done = run_python("-m", "controlplane.cli", "mcp", "--db", f"sqlite:///{db}", *args, timeout=60)

    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert not db.exists()


def test_sigterm_ends_a_stdio_server_and_its_running_task_is_killed(
    reaped: Reaper, sqlite_url: str
) -> None:
    command = cli_command()
    server = reaped.add(
        LinesProcess(
            Path(command[1]), *command[2:], "mcp", "--db", sqlite_url, "--setup", f"{SETUP}:slow",
            name="mcp-stdio",
        )
    )  # fmt: skip
    # The stdio transport is one JSON-RPC message per line: the handshake era, by hand.
    server.say(json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}},
    }))  # fmt: skip
    assert json.loads(server.next_line())["id"] == 1
    server.say(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    server.say(json.dumps({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "subagent", "arguments": {"description": "d", "prompt": "x"}},
    }))  # fmt: skip
    started = json.loads(server.next_line())["result"]["content"][0]["text"]
    task_id = started.rsplit(" ", 1)[-1]

    server.proc.send_signal(signal.SIGTERM)

    assert server.proc.wait(EXIT_S) == 0, server.stderr()
    assert _status(sqlite_url, task_id) is TaskStatus.KILLED


def test_sigterm_ends_an_http_server_and_its_running_task_is_killed(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url, setup="slow")

    async def start() -> str:
        async with _client(server.url) as client:
            return text_of(await client.call_tool("subagent", {"description": "d", "prompt": "x"}))

    task_id = run(start).rsplit(" ", 1)[-1]

    server.process.proc.send_signal(signal.SIGTERM)

    assert server.process.proc.wait(EXIT_S) == 0, server.process.stderr()
    assert _status(sqlite_url, task_id) is TaskStatus.KILLED


@pytest.mark.parametrize(
    ("line", "code", "message"),
    [
        ("{not json", -32700, "Parse error: not JSON"),
        ("[1, 2]", -32600, "Invalid Request: not a JSON-RPC message"),
        ('{"jsonrpc": "2.0", "id": 1}', -32600, "Invalid Request: not a JSON-RPC message"),
    ],
)
@pytest.mark.slow  # measured: 12 s under load (--durations)
def test_a_malformed_line_over_stdio_gets_a_json_rpc_error_and_changes_nothing(
    reaped: Reaper, sqlite_url: str, line: str, code: int, message: str
) -> None:
    server = RawStdio(reaped, sqlite_url)

    server.process.say(line)
    refused = json.loads(server.process.next_line())
    server.initialize({})
    tasks = server.request("tools/call", {"name": "task_list", "arguments": {}})["result"]

    assert refused == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": code, "message": message},
    }
    assert tasks["content"][0]["text"] == "(no tasks)"
