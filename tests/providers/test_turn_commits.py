"""How many commits a turn of the agent loop costs: a turn its reply ends writes the reply
with ``turn/end`` and the Task's settlement, in one transaction (SQLite, statements traced
on the store's connections)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall
from tests.support import SqliteStatements

WAIT_S = 10.0


class EventWrites(SqliteStatements):
    """Counts the write transactions that write events: as open rows, or (a batch that
    ends its turn) straight into the turn's segment. Housekeeping writes no event, so it
    is never counted."""

    def counts(self, statements: Sequence[str], *, transaction: bool) -> bool:
        heads = (statement.lstrip()[:40].upper() for statement in statements)
        return transaction and any(
            head.startswith("INSERT") and ("SUBAGENT_EVENTS" in head or "SUBAGENT_SEGMENTS" in head)
            for head in heads
        )


@pytest.fixture
def writes() -> Iterator[EventWrites]:
    with EventWrites() as counted:
        yield counted


def _turn(tmp_path: Path, writes: EventWrites, replies: list[str | ModelReply]) -> list[str]:
    """The event kinds of a resumed child's second turn; ``writes`` counts only that turn."""
    control = SubagentControl.open(f"sqlite:///{tmp_path / 'turns.db'}")
    try:
        tools = [_look_tool()]
        control.providers.register(
            InProcessProvider(ScriptedModel(["first", *replies]), tools=tools)
        )
        parent = control.agents.register("parent-1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="turns", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        assert control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent).status is (
            TaskStatus.COMPLETED
        )
        writes.count = 0
        sent = control.send_message(parent, started.child_id, [TextBlock(text="on")], None)
        done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.usage.model_calls == len(replies)
        assert control.store is not None
        events = control.store.load(started.child_id).events
        return [e.kind for e in events if e.turn == 2]
    finally:
        control.close(timeout_s=10.0)


def _look_tool() -> ChildTool:
    return ChildTool(
        name="look",
        description="look around",
        parameters={"type": "object", "properties": {}},
        handler=lambda _args: "nothing here",
    )


def test_a_turn_its_reply_ends_commits_the_reply_with_its_end(
    tmp_path: Path, writes: EventWrites
) -> None:
    kinds = _turn(tmp_path, writes, ["done"])

    assert kinds == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,
        EventKind.TURN_END,
    ]
    # The claim with the turn's frame, then the reply with the end and the settlement.
    assert writes.count == 2


def test_only_the_turns_last_reply_is_kept_for_its_end_and_the_order_holds(
    tmp_path: Path, writes: EventWrites
) -> None:
    look = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])

    kinds = _turn(tmp_path, writes, [look, "seen it"])

    assert kinds == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,
        "tool/call",
        "tool/result",
        EventKind.ASSISTANT_MESSAGE,
        EventKind.TURN_END,
    ]
