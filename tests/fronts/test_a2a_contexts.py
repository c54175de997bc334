"""A message naming only a context: the server knows the context is its parent's child from
the child's stored header (one point read, then remembered) or, while the child is still
starting and nothing is stored, from its Task. (Another session's context is not found:
`test_a2a_bad_input`.)"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from controlplane import AgentHandle, SubagentControl, TaskStatus
from tests.fakes import FakeProvider
from tests.fronts.a2a_support import a2a_client, message, run, send, served
from tests.support import (
    eventually,
    held_messages,
    is_durable,
    running_child,
    settle,
    starting_child,
)

if TYPE_CHECKING:  # at run time the support module first skips without the 'a2a' extra
    from a2a.types.a2a_pb2 import Task

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def a2a_parent(control: SubagentControl) -> AgentHandle:
    return control.agents.register("a2a")


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """The gate the children's turns wait on, opened after the test."""
    gate = threading.Event()
    yield gate
    gate.set()


def test_a_context_the_server_has_not_seen_is_found_from_its_stored_header(
    control: SubagentControl,
    a2a_parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    child_id, task_id, _plan = running_child(control, a2a_parent, provider, release)

    with served(control, a2a_parent, provider=provider.name) as url:

        async def body() -> list[Task]:
            async with a2a_client(url, streaming=False) as client:
                return [await send(client, message(text, context_id=child_id)) for text in "AB"]

        answers = run(body)

    assert [(task.id, task.context_id) for task in answers] == [(task_id, child_id)] * 2
    assert provider.steered_texts(child_id) == ["A", "B"]


def test_a_context_still_starting_is_found_and_the_message_waits_for_its_publication(
    control: SubagentControl,
    a2a_parent: AgentHandle,
    provider: FakeProvider,
    release: threading.Event,
) -> None:
    gate = threading.Event()
    started, _plan = starting_child(control, a2a_parent, provider, gate, result_gate=release)
    assert not is_durable(control, started.child_id)

    with served(control, a2a_parent, provider=provider.name) as url:

        async def body() -> Task:
            async with a2a_client(url, streaming=False) as client:
                sending = asyncio.ensure_future(
                    send(client, message("also Z", context_id=started.child_id))
                )
                held = lambda: held_messages(control, started.child_id) == 1  # noqa: E731
                await asyncio.to_thread(eventually, held, "the message is held")
                gate.set()
                return await sending

        answer = run(body)

    assert (answer.id, answer.context_id) == (started.task_id, started.child_id)
    assert provider.steered_texts(started.child_id) == ["also Z"]
    release.set()
    assert settle(control, started.task_id, a2a_parent).status is TaskStatus.COMPLETED


def test_a_message_to_a_context_that_is_no_child_starts_a_new_one(
    control: SubagentControl, a2a_parent: AgentHandle, provider: FakeProvider
) -> None:
    unknown = str(uuid.uuid4())

    with served(control, a2a_parent, provider=provider.name) as url:

        async def body() -> Task:
            async with a2a_client(url, streaming=False) as client:
                return await send(client, message("hello", context_id=unknown))

        answer = run(body)

    assert answer.context_id != unknown
    assert [task.id for task in control.tasks.list(a2a_parent)] == [answer.id]
    assert settle(control, answer.id, a2a_parent).status is TaskStatus.COMPLETED
