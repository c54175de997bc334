"""A parked Task's continuation claims off its supervisor's mailbox, as a resume does: the
supervisor records that the claim runs, holds what comes meanwhile and keeps answering;
the claim's result then decides what it held (steered into the continued turn)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SendResult,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import SupervisorNode
from controlplane.models import ModelReply, ToolCall
from controlplane.providers._agent_loop import THREAD_PREFIX
from persistence import SqlStore
from tests.support import WAIT_S, eventually, gated_control, held_messages, in_thread, text

DEPLOY = ModelReply(
    text="shipping it", tool_calls=[ToolCall(id="c1", name="deploy", arguments={"env": "prod"})]
)

pytestmark = pytest.mark.timeout(60)


class _GatedContinueStore(SqlStore):
    """A real store whose next claim of a parked Task waits, once armed, until the test
    opens the gate."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.claiming = threading.Event()
        self.gate = threading.Event()

    def continue_parked(self, *args: Any, **kwargs: Any) -> int | None:
        if self.armed:
            self.armed = False
            self.claiming.set()
            assert self.gate.wait(WAIT_S)
        return super().continue_parked(*args, **kwargs)


@pytest.fixture
def gated(sqlite_url: str) -> Iterator[SubagentControl]:
    deploy = ChildTool(
        "deploy",
        "Deploy.",
        {"type": "object", "properties": {"env": {"type": "string"}}},
        lambda arguments: f"deployed {arguments['env']}",
        approval="always",
    )
    provider = InProcessProvider(ScriptedModel([DEPLOY, "done"]), tools=[deploy])
    store = _GatedContinueStore(sqlite_url)
    with gated_control(store, provider, approval_grace_s=0.05) as control:
        yield control


def _node(control: SubagentControl, child_id: str) -> SupervisorNode:
    """The child's supervisor as the tree dump shows it (waiting as long as a test may)."""
    (node,) = [n for n in control.dump_tree(timeout_s=WAIT_S).supervisors if n.child_id == child_id]
    return node


def _run_threads(child_id: str) -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and child_id in t.name
    ]


def test_a_parked_tasks_continuation_claims_off_the_mailbox_and_steers_what_it_held(
    gated: SubagentControl,
) -> None:
    store = gated.store
    assert isinstance(store, _GatedContinueStore)
    parent = gated.agents.register("p1")
    started = gated.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="ship", prompt=[TextBlock(text="go")], parent=parent
        )
    )
    child_id, task_id = started.child_id, started.task_id
    asked = gated.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert asked.status is TaskStatus.INPUT_REQUIRED
    assert asked.request is not None
    eventually(lambda: not _run_threads(child_id), "its run parked")
    store.armed = True

    first = in_thread(lambda: gated.send_message(parent, child_id, text("use blue")))
    assert store.claiming.wait(WAIT_S)
    # Answered by the supervisor while the continuation's claim is blocked, not "busy".
    assert _node(gated, child_id).state == "starting"
    second = in_thread(lambda: gated.send_message(parent, child_id, text("and green")))
    eventually(lambda: held_messages(gated, child_id) == 1, "the second message is held")
    assert not first.done()  # not answered before its message is durable
    store.gate.set()

    assert first.result(WAIT_S) == SendResult(route="steered", task_id=task_id)
    assert second.result(WAIT_S) == SendResult(route="steered", task_id=task_id)
    gated.answer(parent, asked.request.id, allow=True)
    eventually(lambda: gated.tasks.get(task_id, requester=parent).status.is_terminal, "it settled")
    assert gated.tasks.get(task_id, requester=parent).status is TaskStatus.COMPLETED
    stored = store.load(child_id).events
    steers = [e for e in stored if e.kind == EventKind.STEERING_MESSAGE]
    assert len(steers) == 2  # each message once, into the one parked turn
    assert {e.turn for e in steers} == {stored[-1].turn}
