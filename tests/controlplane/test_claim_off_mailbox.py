"""A resume's claim runs off its supervisor's mailbox: the supervisor records that the
claim runs, holds what comes meanwhile, and keeps answering; the claim's result then
decides what it held (steered into the claimed turn)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ErrorCode,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
)
from controlplane.contract import SupervisorNode
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    events,
    eventually,
    gated_control,
    held_messages,
    idle_child,
    in_thread,
    inbound,
    raises,
    settle,
    task_ids,
    text,
)


class _GatedClaimStore(SqlStore):
    """A real store whose next claim of a child waits, once armed, until the test opens
    the gate."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.refuse = False  # the armed claim is refused once the gate opens
        self.claiming = threading.Event()
        self.gate = threading.Event()

    def admit_claiming(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            self.claiming.set()
            assert self.gate.wait(WAIT_S)
            if self.refuse:
                raise SubagentControlError(ErrorCode.STORE_UNAVAILABLE, "the store went away")
        return super().admit_claiming(*args, **kwargs)


@pytest.fixture
def gated(sqlite_url: str, provider: FakeProvider) -> Iterator[SubagentControl]:
    with gated_control(_GatedClaimStore(sqlite_url), provider) as control:
        yield control


@pytest.fixture
def gated_store(gated: SubagentControl) -> _GatedClaimStore:
    store = gated.store
    assert isinstance(store, _GatedClaimStore)
    return store


@pytest.fixture
def gated_parent(gated: SubagentControl) -> AgentHandle:
    return gated.agents.register("parent-1", model=PARENT_MODEL)


def node_of(control: SubagentControl, child_id: str) -> SupervisorNode:
    """The child's supervisor as the tree dump shows it (waiting as long as a test may)."""
    (node,) = [n for n in control.dump_tree(timeout_s=WAIT_S).supervisors if n.child_id == child_id]
    return node


def test_a_message_sent_during_a_slow_claim_is_held_then_steered_into_the_started_turn(
    gated: SubagentControl,
    gated_store: _GatedClaimStore,
    gated_parent: AgentHandle,
    provider: FakeProvider,
) -> None:
    child = idle_child(gated, gated_parent)
    release = threading.Event()
    provider.plan(result_gate=release)
    gated_store.armed = True

    first = in_thread(lambda: gated.send_message(gated_parent, child, text("one")))
    assert gated_store.claiming.wait(WAIT_S)
    second = in_thread(lambda: gated.send_message(gated_parent, child, text("two")))
    # Held by the supervisor while the claim runs (its mailbox answers the tree dump).
    eventually(lambda: held_messages(gated, child) == 1, "the second message is held")
    assert not first.done()  # not answered before its message is durable
    gated_store.gate.set()

    started = first.result(WAIT_S)
    assert started.route == "started"
    assert second.result(WAIT_S) == SendResult(route="steered", task_id=started.task_id)
    release.set()
    assert settle(gated, started.task_id, gated_parent).status is TaskStatus.COMPLETED
    assert [steer.text for steer in provider.steers] == ["two"]
    stored = events(gated, child)
    (one,) = inbound(stored, "one")
    (two,) = inbound(stored, "two")
    assert one.turn == two.turn  # one turn, one activation: no message lost or doubled
    assert len(task_ids(gated, gated_parent)) == 2  # the first turn's Task and this one


def test_the_supervisor_answers_a_status_ask_while_its_claim_is_blocked(
    gated: SubagentControl, gated_store: _GatedClaimStore, gated_parent: AgentHandle
) -> None:
    child = idle_child(gated, gated_parent)
    gated_store.armed = True

    sending = in_thread(lambda: gated.send_message(gated_parent, child, text("one")))
    assert gated_store.claiming.wait(WAIT_S)

    node = node_of(gated, child)  # answered by the supervisor, not shown "busy"
    assert node.state == "starting"
    assert node.task_id is None  # the claim names it
    assert not sending.done()
    gated_store.gate.set()
    started = sending.result(WAIT_S)
    assert started.route == "started"
    assert settle(gated, started.task_id, gated_parent).status is TaskStatus.COMPLETED
    assert len(inbound(events(gated, child), "one")) == 1


def test_a_refused_claim_refuses_its_sender_and_what_it_held_is_decided_afresh(
    gated: SubagentControl, gated_store: _GatedClaimStore, gated_parent: AgentHandle
) -> None:
    child = idle_child(gated, gated_parent)
    gated_store.armed = gated_store.refuse = True

    first = in_thread(lambda: gated.send_message(gated_parent, child, text("one")))
    assert gated_store.claiming.wait(WAIT_S)
    second = in_thread(lambda: gated.send_message(gated_parent, child, text("two")))
    eventually(lambda: held_messages(gated, child) == 1, "the second message is held")
    gated_store.gate.set()

    with raises(ErrorCode.STORE_UNAVAILABLE):
        first.result(WAIT_S)
    started = second.result(WAIT_S)  # its own resume, once the first claim was refused
    assert started.route == "started"
    assert settle(gated, started.task_id, gated_parent).status is TaskStatus.COMPLETED
    stored = events(gated, child)
    assert inbound(stored, "one") == []
    assert len(inbound(stored, "two")) == 1
    assert len(task_ids(gated, gated_parent)) == 2  # the first turn's Task and this one
