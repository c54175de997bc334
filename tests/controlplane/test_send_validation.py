"""SPEC §5 send_message 4: a synchronous raise means the message was not delivered."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import AgentHandle, ErrorCode, SubagentControl, TaskStatus, TextBlock
from tests.fakes import FakeProvider
from tests.support import carrying, events, raises, settle, start_child, task_ids, text


@pytest.fixture
def idle_child(control: SubagentControl, parent: AgentHandle) -> str:
    started = start_child(control, parent)
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    return started.child_id


def test_a_dead_parent_cannot_send(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, idle_child: str
) -> None:
    parent.dispose()

    with raises(ErrorCode.UNAUTHORIZED):
        control.send_message(parent, idle_child, text("from beyond"))

    assert provider.resumes == []
    assert len(task_ids(control, parent.session_id)) == 1
    assert carrying(events(control, idle_child), "from beyond") == []


@pytest.mark.parametrize(
    "child_id", ["", None, 42, "x" * 1000], ids=["empty", "none", "int", "huge"]
)
def test_a_malformed_child_id_is_invalid_input(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, child_id: Any
) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, child_id, text("hello"))

    assert task_ids(control, parent) == []
    assert provider.resumes == []


@pytest.mark.parametrize(
    "message",
    ["", [{"type": "image"}], [TextBlock(text="ok"), 7], None, b"bytes"],
    ids=["empty-string", "foreign-block", "mixed", "none", "bytes"],
)
def test_a_malformed_message_is_invalid_input_and_changes_nothing(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    idle_child: str,
    message: Any,
) -> None:
    before = events(control, idle_child)

    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, idle_child, message)

    assert len(task_ids(control, parent)) == 1
    assert provider.resumes == []
    assert events(control, idle_child) == before
