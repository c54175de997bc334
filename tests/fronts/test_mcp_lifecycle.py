"""How an MCP server process starts and ends: a bad command line fails before anything is
opened, and SIGTERM (stdio or HTTP) or the stdio client's disconnect ends a server through
``control.close()``, which hands its running Tasks over (SPEC §9 "Handover on close"): a
runtime with the children's provider carries each on, same Task, and it completes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from controlplane import InProcessProvider, ScriptedModel, SubagentControl, TaskStatus
from tests.fronts.mcp_support import SETUP, HttpServer, RawStdio, cli_command, run, text_of
from tests.fronts.test_mcp_http import _client
from tests.reliability.processes import LinesProcess, Reaper
from tests.support import run_python

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

EXIT_S = 30.0


def _completed_elsewhere(url: str, task_id: str) -> None:
    """The handed-over Task is running in the store, and a runtime with its provider
    (answering at once) carries it on to ``completed``: the same Task, recovered once."""
    with SubagentControl.open(url) as control:
        assert control.tasks.get(task_id, requester="mcp").status is TaskStatus.RUNNING
        control.providers.register(InProcessProvider(ScriptedModel(echo=True)))
        done = control.tasks.wait(task_id, timeout=EXIT_S, requester="mcp")
        assert done.status is TaskStatus.COMPLETED, done
        assert done.recoveries == 1


def _stdio_started(reaped: Reaper, url: str) -> tuple[LinesProcess, str]:
    """A stdio server with a slow child running: the server and the child's Task id."""
    command = cli_command()
    server = reaped.add(
        LinesProcess(
            Path(command[1]), *command[2:], "mcp", "--db", url, "--setup", f"{SETUP}:slow",
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
    return server, started.rsplit(" ", 1)[-1]


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


def test_sigterm_ends_a_stdio_server_and_its_running_task_completes_elsewhere(
    reaped: Reaper, sqlite_url: str
) -> None:
    server, task_id = _stdio_started(reaped, sqlite_url)

    server.proc.send_signal(signal.SIGTERM)

    assert server.proc.wait(EXIT_S) == 0, server.stderr()
    _completed_elsewhere(sqlite_url, task_id)


def test_a_stdio_client_that_disconnects_leaves_its_child_to_complete_elsewhere(
    reaped: Reaper, sqlite_url: str
) -> None:
    server, task_id = _stdio_started(reaped, sqlite_url)

    assert server.proc.stdin is not None
    server.proc.stdin.close()  # the client went away

    assert server.proc.wait(EXIT_S) == 0, server.stderr()
    _completed_elsewhere(sqlite_url, task_id)


def test_sigterm_ends_an_http_server_and_its_running_task_completes_elsewhere(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url, setup="slow")

    async def start() -> str:
        async with _client(server.url) as client:
            return text_of(await client.call_tool("subagent", {"description": "d", "prompt": "x"}))

    task_id = run(start).rsplit(" ", 1)[-1]

    server.process.proc.send_signal(signal.SIGTERM)

    assert server.process.proc.wait(EXIT_S) == 0, server.process.stderr()
    _completed_elsewhere(sqlite_url, task_id)


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
