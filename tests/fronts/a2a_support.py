"""Helpers of the A2A front's tests: servers (in this process on a loopback port, or the
real command as a subprocess), the SDK's own client, and bounded async waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from controlplane import AgentHandle, SubagentControl
from tests.reliability.processes import LinesProcess
from tests.support import WAIT_S

pytest.importorskip("a2a", reason="the A2A front needs the 'a2a' extra")

from a2a.client import Client, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from controlplane.fronts._a2a import A2AServer

__all__ = [  # the SDK's names the tests use, imported once the extra is known to be there
    "CancelTaskRequest",
    "GetTaskRequest",
    "InvalidParamsError",
    "ListTasksRequest",
    "Part",
    "Role",
    "TaskNotCancelableError",
    "TaskNotFoundError",
    "TaskState",
    "UnsupportedOperationError",
]

T = TypeVar("T")

TEST_S = 30.0
"""The bound on one test's async body."""


def run(body: Callable[[], Awaitable[T]], timeout_s: float = TEST_S) -> T:
    """Run an async test body in a fresh event loop, bounded."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await body()

    return asyncio.run(bounded())


@contextmanager
def served(control: SubagentControl, parent: AgentHandle, **options: Any) -> Iterator[str]:
    """An A2A server for ``parent`` on a free loopback port, in a thread; its URL."""
    server = A2AServer(control, parent, **options).start()
    try:
        yield server.url
    finally:
        server.stop()


@asynccontextmanager
async def a2a_client(
    url: str, *, streaming: bool = True, token: str | None = None
) -> AsyncIterator[Client]:
    """The SDK's client for the server at ``url`` (from its card), with a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(headers=headers, timeout=WAIT_S) as http:
        client = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
        async with client:
            yield client


def message(
    text: str, *, context_id: str = "", task_id: str = "", immediately: bool = True
) -> SendMessageRequest:
    """A user message; ``immediately``: a non-streaming send answers without waiting."""
    return SendMessageRequest(
        message=Message(
            message_id=f"m-{text[:20]}",
            role=Role.ROLE_USER,
            context_id=context_id,
            task_id=task_id,
            parts=[Part(text=text)],
        ),
        configuration=SendMessageConfiguration(return_immediately=immediately),
    )


async def send(client: Client, request: SendMessageRequest) -> Task:
    """Send without streaming; the Task that answered."""
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1, answers
    assert answers[0].HasField("task"), answers
    return answers[0].task


async def stream(responses: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    """Every event of a stream, to its end."""
    return [response async for response in responses]


async def first_task(responses: AsyncIterator[StreamResponse]) -> Task:
    """A stream's first event, which A2A makes the Task."""
    first = await anext(aiter(responses))
    assert first.HasField("task"), first
    return first.task


async def wait_state(client: Client, task_id: str, *states: TaskState) -> Task:
    """Poll GetTask (bounded) until the Task is in one of ``states``."""
    pause = 0.01
    async with asyncio.timeout(WAIT_S):
        while True:
            task = await client.get_task(GetTaskRequest(id=task_id))
            if task.status.state in states:
                return task
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)


def subscribe(client: Client, task_id: str) -> AsyncIterator[StreamResponse]:
    """Subscribe to a Task's stream."""
    return client.subscribe(SubscribeToTaskRequest(id=task_id))


def texts(responses: list[StreamResponse]) -> list[str]:
    """The agent message texts of a stream's status updates, in order."""
    return [
        part.text
        for response in responses
        if response.HasField("status_update")
        for part in response.status_update.status.message.parts
        if response.status_update.status.message.role == Role.ROLE_AGENT
    ]


class A2AProcess(LinesProcess):
    """``python -m controlplane.cli a2a`` on ``bind`` (a free loopback port by default): add
    it to the test's reaper first, then wait for it with `ready`."""

    def __init__(
        self,
        url: str,
        *args: str,
        name: str,
        stderr: Path | None = None,
        bind: str = "127.0.0.1:0",
        env: Mapping[str, str] | None = None,
    ) -> None:
        # LinesProcess runs `python SCRIPT ARGS`: here the script is the CLI module.
        super().__init__(
            Path("-m"),
            "controlplane.cli",
            "a2a",
            "--db",
            url,
            "--http",
            bind,
            *args,
            name=name,
            stderr=stderr,
            env=env,
        )
        self.url = ""

    def ready(self) -> str:
        """Wait (bounded) until it listens; its URL."""
        self.url = self.expect("ready ")
        return self.url
