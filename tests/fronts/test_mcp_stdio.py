"""The MCP front over stdio: ``python -m controlplane.cli mcp`` as a real subprocess, driven
by the SDK's client (which starts it, and ends and reaps it when the client closes)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from controlplane.fronts.mcp_tasks import CreatedTask, TasksClient, get_task
from controlplane.tools import ToolHandlers
from tests.fronts.mcp_support import SETUP, run, text_of
from tests.support import REPO

pytestmark = pytest.mark.timeout(90)


def _server(db: str, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "controlplane.cli", "mcp", "--db", db, "--setup", f"{SETUP}:echo", *args],
        cwd=str(REPO),
    )


def test_the_tools_listed_are_the_tool_handlers_definitions(sqlite_url: str) -> None:
    async def conversation() -> list[dict[str, object]]:
        async with Client(_server(sqlite_url, "--stdio")) as client:
            listed = await client.list_tools()
            return [
                {"name": t.name, "description": t.description, "parameters": t.input_schema}
                for t in listed.tools
            ]

    assert run(conversation) == ToolHandlers.definitions()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.slow  # measured: 10 s under load (--durations)
def test_a_plain_subagent_call_then_task_output_with_wait(sqlite_url: str, mode: str) -> None:
    async def conversation() -> tuple[str, str, str]:
        async with Client(_server(sqlite_url), mode=mode) as client:
            started = text_of(
                await client.call_tool("subagent", {"description": "otters", "prompt": "hello"})
            )
            task_id = started.rsplit(" ", 1)[-1]
            waited = {"task_id": task_id, "wait": True, "timeout_s": 10}
            output = text_of(await client.call_tool("task_output", waited))
            agents = text_of(await client.call_tool("list_agents", {}))
            return started, output, agents

    started, output, agents = run(conversation)

    assert started.startswith("started subagent ")
    assert output == "echo: hello\n[status: completed]"
    child_id = started.split()[2]
    assert agents.startswith(f"{child_id} [ready] — otters")


@pytest.mark.slow  # measured: 7 s under load (--durations)
def test_a_task_augmented_call_over_stdio_is_followed_by_tasks_get(sqlite_url: str) -> None:
    async def conversation() -> tuple[CreatedTask, str]:
        async with Client(_server(sqlite_url), extensions=[TasksClient()]) as client:
            created = await client.session.call_tool(
                "subagent", {"description": "d", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            for _ in range(200):  # bounded: 200 polls of the advertised interval at most
                task = await get_task(client.session, created.task_id)
                if task.is_terminal:
                    return created, task.status
                await anyio.sleep((task.poll_interval_ms or 50) / 1000)
            raise AssertionError("the task never settled")

    created, status = run(conversation)

    assert status == "completed"
    assert created.status == "working"


@pytest.mark.slow  # measured: 6 s under load (--durations)
def test_bad_tool_arguments_are_an_error_result_that_starts_nothing(sqlite_url: str) -> None:
    async def conversation() -> tuple[bool, str, str]:
        async with Client(_server(sqlite_url)) as client:
            bad = await client.call_tool("subagent", {"description": "d", "prompt": ""})
            tasks = text_of(await client.call_tool("task_list", {}))
            return bool(bad.is_error), text_of(bad), tasks

    is_error, message, tasks = run(conversation)

    assert is_error
    assert message.startswith("error [INVALID_INPUT]: invalid arguments for subagent")
    assert tasks == "(no tasks)"


def test_without_the_extra_the_command_says_which_extra_to_install(tmp_path: Path) -> None:
    # A `mcp` module that fails to import stands in for the missing extra.
    (tmp_path / "mcp").mkdir()
    (tmp_path / "mcp" / "__init__.py").write_text("raise ImportError('no mcp here')\n")
    from tests.support import run_python

    done = run_python(
        "-m", "controlplane.cli", "mcp", "--db", f"sqlite:///{tmp_path}/s.db",
        timeout=60.0, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "pip install 'subagent-control[mcp]'" in done.stderr


@pytest.mark.slow  # measured: 8 s under load (--durations)
def test_openai_model_serves_children_on_a_chat_completions_server(sqlite_url: str) -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    from tests.providers.openai_server import ChatServer

    with ChatServer([{"text": "four facts about otters"}]) as chat:
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "controlplane.cli", "mcp", "--db", sqlite_url,
                  "--openai-model", "m", "--openai-base-url", chat.base_url],
            cwd=str(REPO),
        )  # fmt: skip

        async def conversation() -> str:
            async with Client(server) as client:
                started = text_of(
                    await client.call_tool("subagent", {"description": "d", "prompt": "otters"})
                )
                waited = {"task_id": started.rsplit(" ", 1)[-1], "wait": True, "timeout_s": 20}
                return text_of(await client.call_tool("task_output", waited))

        output = run(conversation)
        requests = chat.requests

    assert output == "four facts about otters\n[status: completed]"
    assert requests[0]["model"] == "m"
