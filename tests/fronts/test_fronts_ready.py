"""Fronts that start ready: a server with no provider says so as it starts; ``--demo``
serves a built-in scripted provider (a model that calls a tool, then answers), so trying
a front takes one command; the OpenAI key comes from a named variable, never the command
line; MCP tools take the unique id prefixes the CLI takes; ``-v`` logs one line per
request."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from controlplane import ChildMeta, ErrorCode, SubagentControlError
from controlplane.fronts import Opened
from controlplane.fronts._mcp_ids import expand_ids
from tests.fronts.mcp_support import cli_command, run, text_of
from tests.reliability.processes import LinesProcess, Reaper
from tests.support import REPO, eventually, run_python

pytestmark = pytest.mark.timeout(90)

NO_PROVIDER = "subagent-control: serving no provider: every start fails UNKNOWN_PROVIDER"


def _front(reaped: Reaper, *argv: str) -> LinesProcess:
    command = cli_command()
    return reaped.add(LinesProcess(Path(command[1]), *command[2:], *argv, name=argv[0]))


@pytest.mark.slow  # a server process each (a few seconds)
@pytest.mark.parametrize("front", ["mcp", "a2a"])
def test_a_front_without_a_provider_says_so_as_it_starts(
    front: str, sqlite_url: str, reaped: Reaper
) -> None:
    server = _front(reaped, front, "--db", sqlite_url, "--http", "127.0.0.1:0")
    server.next_line()  # it serves: "serving MCP at …" / "ready …"
    assert NO_PROVIDER in server.stderr()
    assert "--demo" in server.stderr()


@pytest.mark.slow  # a server process each (a few seconds)
def test_a_front_with_the_demo_says_which_provider_children_start_on(
    sqlite_url: str, reaped: Reaper
) -> None:
    server = _front(reaped, "mcp", "--db", sqlite_url, "--http", "127.0.0.1:0", "--demo")
    server.next_line()
    assert "subagent-control: children start on provider 'demo'" in server.stderr()
    assert "serving no provider" not in server.stderr()


@pytest.mark.slow  # a server process each (a few seconds)
def test_the_demo_answers_through_its_tool_and_mcp_tools_take_id_prefixes(
    sqlite_url: str,
) -> None:
    async def conversation() -> tuple[str, str, str]:
        async with Client(_server_with_demo(sqlite_url)) as client:
            started = text_of(
                await client.call_tool(
                    "subagent", {"description": "count", "prompt": "count these four words"}
                )
            )
            child_id, task_id = started.split()[2], started.split()[-1]
            waited = {"task_id": task_id[:8], "wait": True, "timeout_s": 20}
            first = text_of(await client.call_tool("task_output", waited))
            sent = text_of(
                await client.call_tool(
                    "send_message", {"subagent_id": child_id[:8], "message": "and two more"}
                )
            )
            again = sent.split()[3] if sent.startswith("message started task") else ""
            second = text_of(
                await client.call_tool(
                    "task_output", {"task_id": again[:8], "wait": True, "timeout_s": 20}
                )
            )
            return first, sent, second

    first, sent, second = run(conversation, timeout_s=60)

    assert first == (
        "demo model: 'count these four words' has 4 word(s); 1 message(s) read in this "
        "conversation\n[status: completed]"
    )
    assert sent.startswith("message started task ")
    assert second.startswith("demo model: 'and two more' has 3 word(s); 2 message(s)")


def _server_with_demo(db: str, *cli_args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "controlplane.cli", *cli_args, "mcp", "--db", db, "--demo"],
        cwd=str(REPO),
    )


def test_an_id_prefix_resolves_among_the_session_s_own_ids_only(opened: Opened) -> None:
    store = opened.control.store
    assert store is not None
    for child_id, session in (("abcd0001-mine", "mcp"), ("abcd0002-mine", "mcp"),
                              ("beef0001-theirs", "someone-else")):  # fmt: skip
        store.create_child(ChildMeta(child_id=child_id, parent_session=session, depth=1))

    assert expand_ids(opened.control, opened.parent, {"subagent_id": "abcd0002"}) == {
        "subagent_id": "abcd0002-mine"
    }
    # Another session's id is neither reached nor revealed: the prefix is passed on as it
    # is, and the tool answers for that text.
    assert expand_ids(opened.control, opened.parent, {"subagent_id": "beef"}) == {
        "subagent_id": "beef"
    }
    with pytest.raises(SubagentControlError) as ambiguous:
        expand_ids(opened.control, opened.parent, {"subagent_id": "abcd", "message": "x"})
    assert ambiguous.value.code is ErrorCode.INVALID_INPUT
    assert "abcd0001-mine, abcd0002-mine" in ambiguous.value.message
    assert "beef" not in ambiguous.value.message


@pytest.mark.slow  # a server process each (a few seconds)
def test_v_logs_one_line_per_request_over_stdio(sqlite_url: str, reaped: Reaper) -> None:
    server = _front(reaped, "-v", "mcp", "--db", sqlite_url, "--demo")
    hello = {"protocolVersion": "2025-11-25", "capabilities": {},
             "clientInfo": {"name": "raw", "version": "0"}}  # fmt: skip
    for number, (method, params) in enumerate(
        [("initialize", hello), ("tools/list", {}), ("tools/call",
         {"name": "list_agents", "arguments": {}})], start=1,
    ):  # fmt: skip
        server.say(json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params}))
        assert json.loads(server.next_line())["id"] == number
        if method == "initialize":
            server.say(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    logged = [line for line in server.stderr().splitlines() if "stdio " in line]
    assert logged == [
        "controlplane.fronts.mcp: stdio initialize",
        "controlplane.fronts.mcp: stdio tools/list",
        "controlplane.fronts.mcp: stdio tools/call list_agents",
    ]


@pytest.mark.slow  # a server process each (a few seconds)
def test_v_logs_one_line_per_http_request(sqlite_url: str, reaped: Reaper) -> None:
    server = _front(reaped, "-v", "mcp", "--db", sqlite_url, "--http", "127.0.0.1:0", "--demo")
    url = server.expect("serving MCP at ")
    request = urllib.request.Request(
        url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError):  # not a JSON-RPC message: refused
        urllib.request.urlopen(request, timeout=10)
    eventually(lambda: "POST /mcp 4" in server.stderr(), "the request is logged")
    assert sum("POST /mcp" in line for line in server.stderr().splitlines()) == 1


@pytest.mark.slow  # a server process each (a few seconds)
def test_the_openai_key_comes_from_the_variable_named_and_a_missing_one_is_refused(
    sqlite_url: str,
) -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    done = run_python(
        "-m", "controlplane.cli", "mcp", "--db", sqlite_url, "--openai-model", "m",
        "--openai-api-key-env", "SUBAGENT_TEST_NO_SUCH_KEY", timeout=60,
        env={"SUBAGENT_TEST_NO_SUCH_KEY": ""},
    )  # fmt: skip
    assert done.returncode == 2
    assert "[INVALID_INPUT] --openai-api-key-env SUBAGENT_TEST_NO_SUCH_KEY" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow  # a server process each (a few seconds)
def test_the_demo_and_setup_are_one_or_the_other(sqlite_url: str) -> None:
    done = run_python(
        "-m", "controlplane.cli", "mcp", "--db", sqlite_url, "--demo",
        "--setup", "tests.fronts.scripted_setup:echo", timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "give one of --setup, --demo, not both" in done.stderr
