"""SPEC §5 start_continuable 2-5: ids, descriptor snapshot, depth, publication, failures."""

from __future__ import annotations

import threading
import uuid

import pytest

from controlplane import (
    AgentHandle,
    ChildMeta,
    Descriptor,
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
)
from tests.fakes import FakeProvider, completed
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    carrying,
    events,
    failed_outcome,
    is_durable,
    kinds,
    running_child,
    settle,
    start_child,
    text,
)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def test_start_returns_ids_before_the_provider_is_called(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    gate = threading.Event()
    plan = provider.plan(start_gate=gate)

    started = start_child(control, parent, label="research X")

    # The provider cannot have returned: its start is gated until after we look.
    assert not plan.returned.is_set()
    assert uuid.UUID(started.child_id).version == 4
    snapshot = control.tasks.get(started.task_id, requester=parent)
    assert snapshot.status is TaskStatus.RUNNING
    assert (snapshot.kind, snapshot.label, snapshot.owner_session) == (
        "subagent",
        "research X",
        parent.session_id,
    )
    assert snapshot.child_id == started.child_id
    gate.set()
    assert settle(control, started.task_id, parent).status is TaskStatus.COMPLETED
    (request,) = provider.starts
    assert request.child_id == started.child_id
    assert [block.text for block in request.prompt] == ["go"]
    assert request.source == MessageSource(kind="user")
    assert request.parent is parent
    assert request.depth == 1
    assert request.descriptor.provider == "fake"
    assert request.transcript.turn == 1


def test_descriptor_omits_undeclared_selectors_and_falls_back_to_parent_model(
    control: SubagentControl, provider: FakeProvider
) -> None:
    modelled = control.agents.register("with-model", model=PARENT_MODEL)
    bare = control.agents.register("without-model")

    inherited = start_child(control, modelled)
    overridden = start_child(control, modelled, agent_model="m2")
    omitted = start_child(control, bare)
    for parent, started in ((modelled, inherited), (modelled, overridden), (bare, omitted)):
        settle(control, started.task_id, parent)

    def stored(child_id: str) -> dict[str, object]:
        (event,) = [e for e in events(control, child_id) if e.kind == EventKind.DESCRIPTOR]
        assert isinstance(event.data, dict)
        return event.data

    assert stored(inherited.child_id) == {
        "version": 1,
        "provider": "fake",
        "agent_provider": "acme",
        "agent_model": "m1",
    }
    assert stored(overridden.child_id) == {
        "version": 1,
        "provider": "fake",
        "agent_provider": "acme",
        "agent_model": "m2",
    }
    assert stored(omitted.child_id) == {"version": 1, "provider": "fake"}
    by_child = {request.child_id: request.descriptor for request in provider.starts}
    assert by_child[omitted.child_id] == Descriptor(provider="fake")


def test_descriptor_is_a_detached_snapshot_of_the_spec(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    gate = threading.Event()
    provider.plan(start_gate=gate)
    inputs = {"topics": ["a"], "limits": {"n": 1}}
    tool_filter = {"allow": ["read"], "deny": []}

    started = start_child(control, parent, inputs=inputs, tool_filter=tool_filter, persona="P")
    inputs["topics"].append("mutated")  # type: ignore[attr-defined]
    inputs["limits"]["n"] = 2  # type: ignore[index]
    tool_filter["deny"].append("write")
    gate.set()
    settle(control, started.task_id, parent)

    expected = {
        "version": 1,
        "provider": "fake",
        "agent_provider": "acme",
        "agent_model": "m1",
        "persona": "P",
        "tool_filter": {"allow": ["read"], "deny": []},
        "inputs": {"topics": ["a"], "limits": {"n": 1}},
    }
    (event,) = [e for e in events(control, started.child_id) if e.kind == EventKind.DESCRIPTOR]
    assert event.data == expected
    assert provider.starts[0].descriptor.to_event_data() == expected


def test_depth_is_parent_depth_plus_one(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    release = threading.Event()
    child_id, task_id, plan = running_child(control, parent, provider, release, local_agent=True)
    assert plan.run is not None
    assert plan.run.local_agent is not None

    # The running child's own agent starts a grandchild.
    grandchild = start_child(control, plan.run.local_agent, label="grandchild")
    settle(control, grandchild.task_id, plan.run.local_agent)
    release.set()
    settle(control, task_id, parent)

    assert control.agents.register("deep", depth=4) is not None
    deep_child = start_child(control, control.agents.get("deep"))  # type: ignore[arg-type]
    settle(control, deep_child.task_id, "deep")

    assert control.store is not None
    depths = {request.child_id: request.depth for request in provider.starts}
    assert depths == {child_id: 1, grandchild.child_id: 2, deep_child.child_id: 5}
    grand_meta = control.store.load(grandchild.child_id).meta
    assert (grand_meta.depth, grand_meta.parent_session) == (2, child_id)
    assert control.store.load(deep_child.child_id).meta.depth == 5


def test_publication_writes_header_and_exactly_one_descriptor_in_turn_1(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(
        writes=[(EventKind.ASSISTANT_MESSAGE, {"content": [{"type": "text", "text": "answer"}]})],
        result=completed("answer"),
    )

    started = start_child(control, parent, prompt="the prompt")
    settle(control, started.task_id, parent)

    assert control.store is not None
    loaded = control.store.load(started.child_id)
    meta = loaded.meta
    assert (meta.child_id, meta.parent_session, meta.depth, meta.seed_length) == (
        started.child_id,
        parent.session_id,
        1,
        0,
    )
    assert meta.created_at is not None
    stored = loaded.events
    assert [event.seq for event in stored] == list(range(1, len(stored) + 1))
    assert {event.turn for event in stored} == {1}
    assert kinds(stored)[0] == EventKind.TURN_START
    assert kinds(stored)[-1] == EventKind.TURN_END
    descriptors = [event for event in stored if event.kind == EventKind.DESCRIPTOR]
    assert len(descriptors) == 1
    assert descriptors[0].data["version"] == 1
    (prompt,) = carrying(stored, "the prompt")
    assert prompt.kind == EventKind.USER_MESSAGE
    assert prompt.source == MessageSource(kind="user")
    # The provider's write is stored once; the control plane does not write it again.
    assert kinds(carrying(stored, "answer")) == [EventKind.ASSISTANT_MESSAGE]
    assert [m.child_id for m in control.store.list_children(parent.session_id)] == [
        started.child_id
    ]


def test_start_failing_before_publication_leaves_no_resumable_child(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    provider.plan(
        writes=[(EventKind.ASSISTANT_MESSAGE, {"text": "half-way"})],
        fail_start=RuntimeError("quota exhausted"),
    )

    started = start_child(control, parent)
    snapshot = settle(control, started.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert "quota exhausted" in (outcome.detail or "")
    assert not is_durable(control, started.child_id)
    assert control.store is not None
    assert control.store.list_children(parent.session_id) == []
    # A follow-up cannot bring it back: refused at once, with no Task and no provider call.
    with pytest.raises(SubagentControlError) as refused:
        control.send_message(parent, started.child_id, text("are you there?"))
    assert refused.value.code is ErrorCode.CHILD_NOT_FOUND
    assert provider.resumes == []
    assert not is_durable(control, started.child_id)


def test_async_start_failure_settles_failed_with_the_providers_error_text(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    gate = threading.Event()
    provider.plan(start_gate=gate, fail_start=RuntimeError("model endpoint refused: 403"))
    done: list[TaskStatus] = []
    control.tasks.on_done(lambda snapshot: done.append(snapshot.status))

    started = start_child(control, parent)
    assert control.tasks.get(started.task_id, requester=parent).status is TaskStatus.RUNNING
    gate.set()
    snapshot = settle(control, started.task_id, parent)

    outcome = failed_outcome(snapshot)
    assert "model endpoint refused: 403" in (outcome.detail or "")
    assert done == [TaskStatus.FAILED]
    assert provider.total_live() == 0


def test_async_start_failure_settles_failed_after_disposing_the_published_run(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    # Publication fails after the provider returned its run: the child id is taken in the
    # store (as by another process) while the provider is still starting.
    control.tasks.on_done(lambda snapshot: provider.record(("outcome", snapshot.child_id or "")))
    gate = threading.Event()
    plan = provider.plan(start_gate=gate, local_agent=True)
    started = start_child(control, parent)
    assert plan.entered.wait(WAIT_S)
    assert control.store is not None
    squatter = ChildMeta(child_id=started.child_id, parent_session="someone-else", depth=1)
    control.store.create_child(squatter)
    gate.set()

    snapshot = settle(control, started.task_id, parent)

    assert snapshot.status is TaskStatus.FAILED
    assert plan.disposed.is_set()
    child = started.child_id
    assert [entry for entry in provider.log if entry[1] == child][-2:] == [
        ("dispose", child),
        ("outcome", child),
    ]
    assert provider.total_live() == 0
    assert control.agents.get(child) is None
    loaded = control.store.load(child)
    assert loaded.meta.parent_session == "someone-else"
    assert loaded.events == []
