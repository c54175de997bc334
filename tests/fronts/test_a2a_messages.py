"""The A2A front with the SDK's own client, against a server in this process on a loopback
port: a message starts, steers or resumes; a task is got, listed, cancelled, followed."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from controlplane import AgentHandle, InProcessProvider, ScriptedModel, SubagentControl
from controlplane.contract import EventKind, TaskSnapshot, TaskStatus
from tests.fronts.a2a_support import (
    CancelTaskRequest,
    ListTasksRequest,
    TaskNotCancelableError,
    TaskState,
    UnsupportedOperationError,
    a2a_client,
    first_task,
    message,
    run,
    send,
    served,
    stream,
    subscribe,
    texts,
    wait_state,
)
from tests.support import WAIT_S, events, inbound

pytestmark = pytest.mark.timeout(60)

WORKING = TaskState.TASK_STATE_WORKING
COMPLETED = TaskState.TASK_STATE_COMPLETED


@pytest.fixture
def a2a_parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("a2a")


@pytest.fixture
def gated(control: SubagentControl) -> ScriptedModel:
    """Each model call waits until the test releases it."""
    model = ScriptedModel(echo=True, gated=True)
    control.providers.register(InProcessProvider(model))
    return model


@pytest.fixture
def echo(control: SubagentControl) -> ScriptedModel:
    model = ScriptedModel(echo=True)
    control.providers.register(InProcessProvider(model))
    return model


async def calls(model: ScriptedModel, n: int) -> None:
    assert await asyncio.to_thread(model.wait_for_calls, n, 10.0), f"no model call {n}"


def test_a_message_without_a_context_starts_a_child_and_streams_it_to_its_end(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> list:  # type: ignore[type-arg]
            async with a2a_client(url) as client:
                return await stream(client.send_message(message("research the bicycle")))

        answered = run(body)

    task = answered[0].task
    snapshot = control.tasks.get(task.id, requester=a2a_parent)
    assert snapshot.child_id == task.context_id
    assert snapshot.label == "research the bicycle"
    assert snapshot.status is TaskStatus.COMPLETED
    # The answer is in the first Task's history or in an update, as the turn was quick.
    said = [m.parts[0].text for m in task.history] + texts(answered)
    assert said.count("echo: research the bicycle") == 1
    artifact = answered[-2].artifact_update.artifact
    assert artifact.parts[0].text == "echo: research the bicycle"
    assert answered[-1].status_update.status.state == COMPLETED


def test_a_message_to_a_working_task_steers_it_and_the_same_task_answers(
    control: SubagentControl, a2a_parent: AgentHandle, gated: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, str, str, str]:
            async with a2a_client(url, streaming=False) as client:
                started = await send(client, message("first"))
                assert started.status.state == WORKING
                await calls(gated, 1)
                by_task = await send(
                    client, message("second", context_id=started.context_id, task_id=started.id)
                )
                by_context = await send(client, message("third", context_id=started.context_id))
                gated.release(3)
                done = await wait_state(client, started.id, COMPLETED)
                return started.id, by_task.id, by_context.id, done.artifacts[0].parts[0].text

        task_id, by_task, by_context, output = run(body)

    assert by_task == by_context == task_id
    snapshot = control.tasks.get(task_id, requester=a2a_parent)
    assert snapshot.child_id is not None
    stored = events(control, snapshot.child_id)
    for steer in ("second", "third"):
        assert [e.kind for e in inbound(stored, steer)] == [EventKind.STEERING_MESSAGE]
    assert output == "echo: third"
    assert len(control.tasks.list(a2a_parent)) == 1


def test_a_message_to_an_idle_context_resumes_it_as_a_new_task(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, str, str, str, str]:
            async with a2a_client(url, streaming=False) as client:
                first = await send(client, message("first", immediately=False))
                assert first.status.state == COMPLETED
                again = await send(
                    client, message("again", context_id=first.context_id, immediately=False)
                )
                return (
                    first.id,
                    first.context_id,
                    again.id,
                    again.context_id,
                    again.artifacts[0].parts[0].text,
                )

        first_id, context, again_id, again_context, output = run(body)

    assert again_id != first_id
    assert again_context == context
    assert output == "echo: again"
    assert [e.turn for e in inbound(events(control, context), "again")] == [2]


def test_an_ended_tasks_answer_comes_once_its_child_is_let_go_so_a_follow_up_resumes_it(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    # A completion listener keeps the ended activation's association for a while (the
    # window between a Task's settlement and its supervisor letting the child go): the
    # answer must not come inside it, or the follow-up would be refused NOT_DELIVERED.
    hold = threading.Event()
    held: list[str] = []

    def listener(done: TaskSnapshot) -> None:
        held.append(done.id)
        hold.wait(1.0)  # bounded: the window's length, never set

    control.tasks.on_done(listener)
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, str, str]:
            async with a2a_client(url, streaming=False) as client:
                first = await send(client, message("first", immediately=False))
                assert first.status.state == COMPLETED
                again = await send(
                    client, message("again", context_id=first.context_id, immediately=False)
                )
                return first.id, again.id, again.artifacts[0].parts[0].text

        first_id, again_id, output = run(body)

    assert held[0] == first_id
    assert again_id != first_id
    assert output == "echo: again"


def test_a_message_naming_an_ended_task_is_refused_and_delivers_nothing_nor_is_it_followed(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, str]:
            async with a2a_client(url, streaming=False) as client:
                ended = await send(client, message("first", immediately=False))
                with pytest.raises(UnsupportedOperationError, match="nothing was delivered"):
                    await send(
                        client, message("late", context_id=ended.context_id, task_id=ended.id)
                    )
            async with a2a_client(url) as client:
                with pytest.raises(UnsupportedOperationError, match="ended"):
                    await stream(subscribe(client, ended.id))
                return ended.id, ended.context_id

        task_id, context = run(body)

    assert inbound(events(control, context), "late") == []
    assert [t.id for t in control.tasks.list(a2a_parent)] == [task_id]


def test_cancel_kills_the_working_task_and_an_ended_one_is_not_cancelable(
    control: SubagentControl, a2a_parent: AgentHandle, gated: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, int]:
            async with a2a_client(url, streaming=False) as client:
                started = await send(client, message("long job"))
                await calls(gated, 1)
                cancelled = await client.cancel_task(CancelTaskRequest(id=started.id))
                with pytest.raises(TaskNotCancelableError):
                    await client.cancel_task(CancelTaskRequest(id=started.id))
                return started.id, cancelled.status.state

        task_id, state = run(body)

    assert state == TaskState.TASK_STATE_CANCELED
    assert control.tasks.get(task_id, requester=a2a_parent).status is TaskStatus.KILLED


def test_a_subscriber_gets_the_task_then_its_messages_through_completion(
    control: SubagentControl, a2a_parent: AgentHandle, gated: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, list]:  # type: ignore[type-arg]
            async with a2a_client(url) as client:
                started = await first_task(client.send_message(message("watch me")))
                following = subscribe(client, started.id)
                task = await first_task(following)
                assert task.id == started.id
                gated.release()
                return started.id, await stream(following)

        task_id, rest = run(body)

    assert texts(rest) == ["echo: watch me"]
    assert rest[-1].status_update.status.state == COMPLETED
    assert rest[-1].status_update.task_id == task_id


def test_list_tasks_gives_the_sessions_tasks_newest_first_and_filters_by_context(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[list[str], list[str], list[str]]:
            async with a2a_client(url, streaming=False) as client:
                one = await send(client, message("one", immediately=False))
                two = await send(client, message("two", immediately=False))
                listed = await client.list_tasks(ListTasksRequest())
                mine = await client.list_tasks(ListTasksRequest(context_id=one.context_id))
                return (
                    [one.id, two.id],
                    [t.id for t in listed.tasks],
                    [t.id for t in mine.tasks],
                )

        made, listed, in_context = run(body)

    assert listed == made[::-1]
    assert in_context == made[:1]


def test_a_v0_3_client_is_served_by_the_same_handler(
    control: SubagentControl, a2a_parent: AgentHandle, echo: ScriptedModel
) -> None:
    """Many A2A clients still speak v0.3 (``message/send``, no ``A2A-Version`` header)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m1",
                "role": "user",
                "parts": [{"kind": "text", "text": "hello from v0.3"}],
            }
        },
    }
    with served(control, a2a_parent, provider="inprocess") as url:
        answer = httpx.post(url, json=body, timeout=WAIT_S).json()["result"]

    assert answer["kind"] == "task"
    assert answer["status"]["state"] == "completed"
    assert answer["artifacts"][0]["parts"][0]["text"] == "echo: hello from v0.3"
    snapshot = control.tasks.get(answer["id"], requester=a2a_parent)
    assert snapshot.child_id == answer["contextId"]


def test_concurrent_steers_of_one_working_task_each_land_once_in_it(
    control: SubagentControl, a2a_parent: AgentHandle, gated: ScriptedModel
) -> None:
    steers = [f"steer {n}" for n in range(12)]
    with served(control, a2a_parent, provider="inprocess") as url:

        async def body() -> tuple[str, str, set[str]]:
            async with a2a_client(url, streaming=False) as client:
                started = await send(client, message("first"))
                answers = await asyncio.gather(
                    *(send(client, message(s, context_id=started.context_id)) for s in steers)
                )
                gated.release(100)
                await wait_state(client, started.id, COMPLETED)
                return started.id, started.context_id, {a.id for a in answers}

        task_id, context, answered = run(body)

    assert answered == {task_id}
    stored = events(control, context)
    for steer in steers:
        assert [e.kind for e in inbound(stored, steer)] == [EventKind.STEERING_MESSAGE]
    assert len(control.tasks.list(a2a_parent)) == 1
