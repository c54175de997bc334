"""Completion notices through the tools: one line per settled Task, for its owner only."""

from __future__ import annotations

from controlplane import (
    TaskSnapshot,
    TaskStatus,
)
from controlplane.models import ModelReply

from .conftest import MakeRig, Rig


def _notice(snapshot: TaskSnapshot, verb: str, body: str) -> str:
    # What the turn spent, when it recorded anything (each model call here, no tokens).
    calls = snapshot.usage.model_calls
    spent = f" (spent 0 tokens, {calls} model call{'' if calls == 1 else 's'})" if calls else ""
    return f"subagent task {snapshot.id} ({snapshot.label}) {verb}{spent}: {' '.join(body.split())}"


def test_a_finished_task_leaves_one_notice_with_its_output(rig: Rig) -> None:
    started = rig.start(description="research X")
    snapshot = rig.settle(started.task_id)

    assert rig.tools.drain_notices() == [_notice(snapshot, "finished", "the answer")]
    assert rig.tools.drain_notices() == []


def test_a_killed_task_leaves_a_stopped_notice_with_its_detail(gated: Rig) -> None:
    started = gated.start(description="research X")
    gated.ok("task_kill", {"task_id": started.task_id})
    snapshot = gated.settle(started.task_id)
    assert snapshot.status is TaskStatus.KILLED
    assert snapshot.outcome is not None

    notices = gated.tools.drain_notices()

    assert len(notices) == 1
    assert notices[0].startswith(f"subagent task {started.task_id} (research X) stopped")
    assert notices[0] == _notice(snapshot, "stopped", snapshot.outcome.detail or "").rstrip(": ")


def test_a_failed_task_leaves_a_failed_notice_with_its_detail(make_rig: MakeRig) -> None:
    rig = make_rig([ModelReply(text="", stop_reason="refusal")])
    started = rig.start(description="research X")
    snapshot = rig.settle(started.task_id)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.detail is not None

    notices = rig.tools.drain_notices()

    assert notices == [_notice(snapshot, "failed", snapshot.outcome.detail)]
    assert "refusal" in notices[0]


def test_notices_come_oldest_first_and_only_to_the_owner(make_rig: MakeRig) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control)
    first = mine.settle(mine.start(description="first").task_id)
    other = theirs.settle(theirs.start(description="other").task_id)
    second = mine.settle(mine.start(description="second").task_id)

    assert mine.tools.drain_notices() == [
        _notice(first, "finished", "the answer"),
        _notice(second, "finished", "the answer"),
    ]
    assert theirs.tools.drain_notices() == [_notice(other, "finished", "the answer")]


def test_a_follow_up_task_gets_its_own_notice(rig: Rig) -> None:
    started = rig.start(description="research X")
    rig.settle(started.task_id)
    rig.tools.drain_notices()

    rig.ok("send_message", {"subagent_id": started.child_id, "message": "more  please"})
    follow_up = rig.settle(rig.control.tasks.list(rig.parent)[-1].id)

    assert rig.tools.drain_notices() == [_notice(follow_up, "finished", "the answer")]
    assert follow_up.label == "more please"
