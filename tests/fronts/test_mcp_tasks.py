"""Our Tasks as MCP tasks (``io.modelcontextprotocol/tasks``), through a real SDK client on
the front in-process: which calls answer with a task, what a task reads, cancellation, and
fencing by parent session."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from controlplane import TaskOutcome, TaskSnapshot, TaskStatus
from controlplane.fronts import Opened, mcp_front
from controlplane.fronts.mcp_tasks import (
    CreatedTask,
    TaskNotice,
    TasksClient,
    cancel_task,
    follow_tasks,
    get_task,
    task_result,
)
from tests.fronts.mcp_support import run, text_of
from tests.support import WAIT_S, start_child

pytestmark = pytest.mark.timeout(60)


async def _created(client: Client, name: str, arguments: dict[str, object]) -> CreatedTask:
    created = await client.session.call_tool(name, arguments, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created


def test_a_start_answers_with_a_task_whose_id_is_our_task_id(opened: Opened) -> None:
    front = mcp_front(opened.control, opened.parent, provider=opened.provider)

    async def conversation() -> tuple[CreatedTask, str]:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            created = await _created(client, "subagent", {"description": "d", "prompt": "hi"})
            done = await task_result(client.session, created.task_id)
            return created, text_of(done)

    created, output = run(conversation)

    snapshot = opened.control.tasks.get(created.task_id, requester=opened.parent)
    assert snapshot.label == "d"
    assert created.status == "working"
    assert output == "echo: hi\n[status: completed]"


def test_tasks_get_reads_completed_with_the_task_output_as_the_result(opened: Opened) -> None:
    front = mcp_front(opened.control, opened.parent, provider=opened.provider)

    async def conversation() -> object:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            created = await _created(client, "subagent", {"description": "d", "prompt": "hi"})
            opened.control.tasks.wait(created.task_id, WAIT_S, requester=opened.parent)
            return await get_task(client.session, created.task_id)

    task = run(conversation)

    assert task.status == "completed"  # type: ignore[attr-defined]
    assert task.result == {  # type: ignore[attr-defined]
        "content": [{"type": "text", "text": "echo: hi\n[status: completed]"}],
        "isError": False,
    }


def test_call_tool_with_the_extension_polls_the_task_to_its_result(opened: Opened) -> None:
    front = mcp_front(opened.control, opened.parent, provider=opened.provider)

    async def conversation() -> str:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            return text_of(await client.call_tool("subagent", {"description": "d", "prompt": "x"}))

    assert run(conversation) == "echo: x\n[status: completed]"


def test_a_client_without_the_capability_gets_the_plain_tool_text(opened: Opened) -> None:
    front = mcp_front(opened.control, opened.parent, provider=opened.provider)

    async def conversation() -> str:
        async with Client(front.server) as client:
            return text_of(await client.call_tool("subagent", {"description": "d", "prompt": "x"}))

    assert run(conversation).startswith("started subagent ")


def test_a_resume_answers_with_a_task_and_a_steer_with_the_plain_text(
    slow_opened: Opened,
) -> None:
    control, parent = slow_opened.control, slow_opened.parent
    front = mcp_front(control, parent, provider=slow_opened.provider)
    first = start_child(control, parent, provider="inprocess")

    async def conversation() -> tuple[str, CreatedTask]:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            steer = {"subagent_id": first.child_id, "message": "also this"}
            steered = await client.session.call_tool("send_message", steer, allow_claimed=True)
            control.tasks.kill(first.task_id, requester=parent)
            control.tasks.wait(first.task_id, WAIT_S, requester=parent)
            resumed = await _created(client, "send_message", {**steer, "message": "go on"})
            return text_of(steered), resumed

    steered, resumed = run(conversation)

    assert steered == f"message delivered to running task {first.task_id}"
    assert resumed.task_id != first.task_id
    assert control.tasks.get(resumed.task_id, requester=parent).child_id == first.child_id


def test_tasks_cancel_kills_the_task_and_it_reads_cancelled(slow_opened: Opened) -> None:
    control, parent = slow_opened.control, slow_opened.parent
    front = mcp_front(control, parent, provider=slow_opened.provider)

    async def conversation() -> tuple[str, str]:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            created = await _created(client, "subagent", {"description": "d", "prompt": "x"})
            await cancel_task(client.session, created.task_id)
            control.tasks.wait(created.task_id, WAIT_S, requester=parent)
            return created.task_id, (await get_task(client.session, created.task_id)).status

    task_id, status = run(conversation)

    assert status == "cancelled"
    assert control.tasks.get(task_id, requester=parent).status is TaskStatus.KILLED


def test_a_failed_task_reads_failed_with_its_detail(sqlite_url: str) -> None:
    from controlplane.fronts import FrontOptions, open_front

    opened = open_front(
        FrontOptions(db=sqlite_url, parent="mcp", setup="tests.fronts.scripted_setup:failing")
    )
    try:
        front = mcp_front(opened.control, opened.parent, provider=opened.provider)

        async def conversation() -> object:
            async with Client(front.server, extensions=[TasksClient()]) as client:
                created = await _created(client, "subagent", {"description": "d", "prompt": "x"})
                opened.control.tasks.wait(created.task_id, WAIT_S, requester=opened.parent)
                return await get_task(client.session, created.task_id)

        task = run(conversation)
    finally:
        opened.control.close(timeout_s=10.0)

    assert task.status == "failed"  # type: ignore[attr-defined]
    assert "the model is down" in task.error["message"]  # type: ignore[attr-defined]
    assert task.error["data"]["status"] == "failed"  # type: ignore[attr-defined]


def test_a_task_of_another_parent_session_is_not_found_and_nothing_changes(
    slow_opened: Opened,
) -> None:
    control = slow_opened.control
    front = mcp_front(control, slow_opened.parent, provider=slow_opened.provider)
    stranger = control.agents.register("someone-else")
    theirs = start_child(control, stranger, provider="inprocess")
    errors: list[MCPError] = []

    async def conversation() -> None:
        async with Client(front.server, extensions=[TasksClient()]) as client:
            for ask in (get_task, cancel_task, task_result):
                with pytest.raises(MCPError) as info:
                    await ask(client.session, theirs.task_id)
                errors.append(info.value)

    run(conversation)

    assert [e.code for e in errors] == [-32602] * 3
    assert all(e.data == {"code": "TASK_NOT_FOUND"} for e in errors)
    assert control.tasks.get(theirs.task_id, requester=stranger).status is TaskStatus.RUNNING


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (TaskStatus.RUNNING, "working"),
        (TaskStatus.QUEUED, "working"),
        (TaskStatus.COMPLETED, "completed"),
        (TaskStatus.FAILED, "failed"),
        (TaskStatus.KILLED, "cancelled"),
        (TaskStatus.INTERRUPTED, "failed"),
    ],
)
def test_our_statuses_map_to_the_extensions(ours: TaskStatus, theirs: str) -> None:
    from controlplane.fronts._mcp_tasks import detailed_task

    now = datetime.now(UTC)
    outcome = None if not ours.is_terminal else TaskOutcome(status=ours, detail="why")
    snapshot = TaskSnapshot(
        id="t1", label="l", owner_session="mcp", status=ours, outcome=outcome, created_at=now,
        settled_at=now if ours.is_terminal else None,
    )  # fmt: skip

    task = detailed_task(snapshot, "out")

    assert task["status"] == theirs
    assert ("pollIntervalMs" in task) is (not ours.is_terminal)
    if theirs == "failed":
        assert task["error"]["message"] == "why"


class _Notices:
    """The ``notifications/tasks`` a client received, and an event once one is terminal."""

    def __init__(self) -> None:
        self.seen: list[TaskNotice] = []
        self.settled = anyio.Event()

    async def __call__(self, notice: TaskNotice) -> None:
        self.seen.append(notice)
        if notice.status in ("completed", "failed", "cancelled"):
            self.settled.set()


def test_a_followed_task_is_notified_at_each_status_change_until_settled(
    opened: Opened,
) -> None:
    front = mcp_front(opened.control, opened.parent, provider=opened.provider)
    notices = _Notices()

    async def conversation() -> str:
        async with Client(front.server, extensions=[TasksClient(on_status=notices)]) as client:
            created = await _created(client, "subagent", {"description": "d", "prompt": "hi"})
            await follow_tasks(client.session, [created.task_id], timeout_s=WAIT_S)
            await notices.settled.wait()
            return created.task_id

    task_id = run(conversation)

    assert {n.task_id for n in notices.seen} == {task_id}
    assert notices.seen[-1].status == "completed"
    assert notices.seen[-1].result == {
        "content": [{"type": "text", "text": "echo: hi\n[status: completed]"}],
        "isError": False,
    }


def test_following_without_the_extension_is_refused_and_another_sessions_task_is_not_followed(
    slow_opened: Opened,
) -> None:
    control = slow_opened.control
    front = mcp_front(control, slow_opened.parent, provider=slow_opened.provider)
    theirs = start_child(control, control.agents.register("someone-else"), provider="inprocess")
    notices = _Notices()

    async def conversation() -> int:
        async with Client(front.server) as plain:
            with pytest.raises(MCPError) as info:
                await follow_tasks(plain.session, [theirs.task_id], timeout_s=WAIT_S)
        async with Client(front.server, extensions=[TasksClient(on_status=notices)]) as client:
            # Not honored: the stream ends at once, with nothing about the Task.
            await follow_tasks(client.session, [theirs.task_id], timeout_s=WAIT_S)
        return info.value.code

    assert run(conversation) == -32021
    assert notices.seen == []
