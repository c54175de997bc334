"""Any server process on the store answers for the parent session: a task started through
one MCP server is read, listed and cancelled through a second one after the first was
SIGKILLed and reaped (PostgreSQL, the shared deployment)."""

from __future__ import annotations

import anyio
import pytest

from controlplane.fronts.mcp_tasks import (
    CreatedTask,
    TaskNotice,
    TasksClient,
    cancel_task,
    follow_tasks,
    get_task,
)
from tests.fronts.mcp_support import HttpServer, run, text_of
from tests.fronts.test_mcp_http import _client
from tests.reliability.processes import Reaper

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.postgres]


def test_a_second_server_answers_for_the_tasks_of_a_killed_one(reaped: Reaper, pg_url: str) -> None:
    first = HttpServer(reaped, pg_url)

    async def start_and_settle() -> tuple[CreatedTask, str]:
        async with _client(first.url, extensions=[TasksClient()]) as client:
            created = await client.session.call_tool(
                "subagent", {"description": "otters", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            waited = {"task_id": created.task_id, "wait": True, "timeout_s": 10}
            return created, text_of(await client.call_tool("task_output", waited))

    created, output = run(start_and_settle)
    first.kill()  # SIGKILL, then waited for: no close(), no goodbye
    assert first.process.proc.returncode == -9

    second = HttpServer(reaped, pg_url)

    async def from_the_second() -> tuple[str, object, str, str]:
        async with _client(second.url, extensions=[TasksClient()]) as client:
            task = await get_task(client.session, created.task_id)
            tasks = text_of(await client.call_tool("task_list", {}))
            agents = text_of(await client.call_tool("list_agents", {}))
            return task.status, task.result, tasks, agents

    status, result, tasks, agents = run(from_the_second)

    assert output == "echo: hi\n[status: completed]"
    assert status == "completed"
    assert result == {"content": [{"type": "text", "text": output}], "isError": False}
    assert created.task_id in tasks
    assert "[ready] — otters" in agents


def test_a_task_still_working_in_a_killed_server_is_answered_by_the_next(
    reaped: Reaper, pg_url: str
) -> None:
    first = HttpServer(reaped, pg_url, setup="slow")

    async def start() -> CreatedTask:
        async with _client(first.url, extensions=[TasksClient()]) as client:
            created = await client.session.call_tool(
                "subagent", {"description": "slow", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            return created

    created = run(start)
    first.kill()
    second = HttpServer(reaped, pg_url, setup="slow")

    async def from_the_second() -> str:
        async with _client(second.url, extensions=[TasksClient()]) as client:
            return (await get_task(client.session, created.task_id)).status

    # Working until a live runtime settles it `interrupted` (read as failed), never lost.
    assert run(from_the_second) in ("working", "failed")


def test_tasks_cancel_through_another_live_server_stops_the_task(
    reaped: Reaper, pg_url: str
) -> None:
    running_in, asked = HttpServer(reaped, pg_url, setup="slow"), HttpServer(reaped, pg_url)

    async def conversation() -> str:
        async with _client(running_in.url, extensions=[TasksClient()]) as one:
            created = await one.session.call_tool(
                "subagent", {"description": "slow", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            async with _client(asked.url, extensions=[TasksClient()]) as other:
                await cancel_task(other.session, created.task_id)
            waited = {"task_id": created.task_id, "wait": True, "timeout_s": 20}
            await one.call_tool("task_output", waited)
            return (await get_task(one.session, created.task_id)).status

    assert run(conversation) == "cancelled"


def test_a_server_notifies_the_settlement_of_a_task_running_in_another(
    reaped: Reaper, pg_url: str
) -> None:
    running_in, follower = HttpServer(reaped, pg_url, setup="slow"), HttpServer(reaped, pg_url)
    seen: list[TaskNotice] = []
    settled = anyio.Event()

    async def on_status(notice: TaskNotice) -> None:
        seen.append(notice)
        if notice.status == "cancelled":
            settled.set()

    async def conversation() -> str:
        async with _client(running_in.url, extensions=[TasksClient()]) as one:
            created = await one.session.call_tool(
                "subagent", {"description": "slow", "prompt": "hi"}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            extensions = [TasksClient(on_status=on_status)]
            async with (
                _client(follower.url, extensions=extensions) as other,
                anyio.create_task_group() as group,
            ):
                group.start_soon(follow_tasks, other.session, [created.task_id])
                await cancel_task(one.session, created.task_id)
                await settled.wait()
            return created.task_id

    task_id = run(conversation)

    assert [n.status for n in seen] == ["working", "cancelled"]
    assert {n.task_id for n in seen} == {task_id}
