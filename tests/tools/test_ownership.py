"""`send_message`'s ownership check: a subagent id is the calling parent's, or the call is
refused ``CHILD_NOT_FOUND`` and nothing is sent, whether the child is stored, still
starting (no header yet), another parent's, or no child at all.

The check reads the child's stored header (one point read, then remembered); a child
still starting is found from its running initial Task. What the check costs is in
`test_ownership_reads` (counted) and the benchmarks' Protocol fronts section (timed).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from controlplane import SubagentControl, TaskStatus
from controlplane.tools import ToolHandlers
from tests.fakes import FakeProvider
from tests.support import WAIT_S, eventually, held_messages, in_thread, is_durable

from .conftest import STARTED, MakeRig, Rig, Started

NOT_FOUND = "CHILD_NOT_FOUND"


@pytest.fixture
def url(store_url: str) -> str:
    """The check reads the store: run it on SQLite and PostgreSQL."""
    return store_url


@pytest.fixture
def fake(rig: Rig) -> FakeProvider:
    """A provider whose starts wait on gates, registered on the rig's control plane."""
    provider = FakeProvider()
    rig.control.providers.register(provider)
    return provider


def _tools(rig: Rig, provider: FakeProvider, session_id: str | None = None) -> ToolHandlers:
    parent = rig.parent
    if session_id is not None:
        parent = rig.control.agents.register(session_id, model=rig.parent.model)
    return ToolHandlers(rig.control, parent, provider=provider.name)


def _start(tools: ToolHandlers) -> Started:
    result = tools.call("subagent", {"description": "research X", "prompt": "go"})
    match = STARTED.fullmatch(result.text)
    assert match is not None, result.text
    return Started(match["child"], match["task"])


def _send(tools: ToolHandlers, child_id: str, message: str = "also Z") -> tuple[str, str | None]:
    result = tools.call("send_message", {"subagent_id": child_id, "message": message})
    return result.text, result.code


def _refusal(child_id: str) -> str:
    return (
        f"error [{NOT_FOUND}]: you have no subagent {child_id!r}; nothing was sent. "
        "Check your subagent ids with list_agents; do not retry this id."
    )


def _stored_parent(control: SubagentControl, child_id: str) -> str | None:
    assert control.store is not None
    return control.store.spend.parent_of(child_id)


# -- another parent's child ------------------------------------------------------------------


def test_another_parents_stored_child_is_refused_even_after_own_children_were_steered(
    make_rig: MakeRig,
) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control)
    own, foreign = mine.start(), theirs.start()
    mine.settle(own.task_id)
    theirs.settle(foreign.task_id)
    mine.ok("send_message", {"subagent_id": own.child_id, "message": "go on"})  # remembered
    tasks_before = len(theirs.control.tasks.list(theirs.parent))
    events_before = len(theirs.events(foreign.child_id))

    for _ in range(2):  # a refusal is never remembered as ours
        text, code = _send(mine.tools, foreign.child_id)
        assert (text, code) == (_refusal(foreign.child_id), NOT_FOUND)

    assert len(theirs.control.tasks.list(theirs.parent)) == tasks_before
    assert len(theirs.events(foreign.child_id)) == events_before


def test_another_parents_child_still_starting_is_refused_at_once(
    rig: Rig, fake: FakeProvider
) -> None:
    theirs = _tools(rig, fake, session_id="parent-2")
    plan = fake.plan(start_gate=threading.Event())
    foreign = _start(theirs)
    assert plan.entered.wait(WAIT_S)
    assert _stored_parent(rig.control, foreign.child_id) is None  # no header yet

    text, code = _send(_tools(rig, fake), foreign.child_id)

    assert (text, code) == (_refusal(foreign.child_id), NOT_FOUND)
    assert held_messages(rig.control, foreign.child_id) == 0
    assert rig.control.tasks.get(foreign.task_id, requester=theirs.parent).status is (
        TaskStatus.RUNNING
    )


# -- no child at all --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "child_id",
    [str(uuid.uuid4()), "no-such-child", "café-child", "nul\x00child"],
    ids=["uuid", "plain", "non-ascii", "nul"],
)
def test_an_id_that_is_no_child_is_refused_and_changes_nothing(rig: Rig, child_id: str) -> None:
    started = rig.start()
    rig.settle(started.task_id)
    before = rig.state()

    text, code = _send(rig.tools, child_id)

    assert (text, code) == (_refusal(child_id), NOT_FOUND)
    assert rig.state() == before


# -- a child still starting -------------------------------------------------------------------


def test_a_child_still_starting_is_found_and_the_message_waits_for_its_publication(
    rig: Rig, fake: FakeProvider
) -> None:
    tools = _tools(rig, fake)
    gate, release = threading.Event(), threading.Event()
    plan = fake.plan(start_gate=gate, result_gate=release)
    started = _start(tools)
    assert plan.entered.wait(WAIT_S)
    assert _stored_parent(rig.control, started.child_id) is None  # no header yet

    sending = in_thread(lambda: _send(tools, started.child_id, "also Z"))
    # Past the check while nothing is stored: the supervisor holds it for publication.
    eventually(lambda: held_messages(rig.control, started.child_id) == 1, "the message is held")
    gate.set()

    text, code = sending.result(WAIT_S)
    assert (text, code) == (f"message delivered to running task {started.task_id}", None)
    assert fake.steered_texts(started.child_id) == ["also Z"]
    assert _stored_parent(rig.control, started.child_id) == rig.parent.session_id
    release.set()
    assert rig.settle(started.task_id).status is TaskStatus.COMPLETED


def test_a_start_that_fails_before_publishing_leaves_no_child_to_send_to(
    rig: Rig, fake: FakeProvider
) -> None:
    tools = _tools(rig, fake)
    gate = threading.Event()
    plan = fake.plan(start_gate=gate, fail_start=RuntimeError("the agent would not start"))
    started = _start(tools)
    assert plan.entered.wait(WAIT_S)
    sending = in_thread(lambda: _send(tools, started.child_id))
    eventually(lambda: held_messages(rig.control, started.child_id) == 1, "the message is held")

    gate.set()

    _text, code = sending.result(WAIT_S)
    assert code == "NOT_DELIVERED"  # it was found while starting, then the start failed
    assert rig.settle(started.task_id).status is TaskStatus.FAILED
    assert not is_durable(rig.control, started.child_id)
    # Found while starting is not remembered: the failed start left nothing to send to.
    text, code = _send(tools, started.child_id)
    assert (text, code) == (_refusal(started.child_id), NOT_FOUND)
