"""Hostile input at the public API (SPEC §5 validation, §8 "bad input: a clear error with its
code, nothing lost, nothing half-written"): whatever hypothesis throws at `start_continuable`,
`send_message`, `tasks.*` and `store.append`, the answer is a result or a coded
`SubagentControlError` — never another exception, never a hang — and a refusal writes nothing.

Examples are derandomized (a fixed seed per test) and few enough to keep the suite fast.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.fakes import FakeProvider
from tests.reliability.hostile import (
    any_value,
    fuzz,
    hostile_text,
    json_values,
    mostly,
    store_counts,
)
from tests.support import PARENT_MODEL, WAIT_S, eventually, is_durable, settle, start_child, text

FUZZ = fuzz(max_examples=150)

START_REFUSALS = {
    ErrorCode.UNKNOWN_PROVIDER,
    ErrorCode.INVALID_DESCRIPTOR,
    ErrorCode.INVALID_INPUT,
    ErrorCode.UNAUTHORIZED,
}
SEND_REFUSALS = {
    ErrorCode.UNAUTHORIZED,
    ErrorCode.INVALID_INPUT,
    ErrorCode.TASK_NOT_FOUND,
    ErrorCode.NOT_DELIVERED,
    ErrorCode.OWNERSHIP_CONFLICT,
    ErrorCode.CHILD_NOT_FOUND,  # an id that is no child: refused at once, no Task
}
TASK_REFUSALS = {ErrorCode.TASK_NOT_FOUND, ErrorCode.INVALID_INPUT, ErrorCode.TIMEOUT}
APPEND_REFUSALS = {ErrorCode.INVALID_INPUT, ErrorCode.CHILD_NOT_FOUND}


@dataclass
class World:
    """One control plane with children and Tasks in every state a call may meet."""

    control: SubagentControl
    provider: FakeProvider
    parent: AgentHandle
    stranger: AgentHandle
    disposed: AgentHandle
    running_child: str
    running_task: str
    idle_child: str
    settled_tasks: list[str]
    stranger_task: str

    def state(self) -> tuple[tuple[int, int], int]:
        """What a refused call must leave unchanged: store rows and Tasks."""
        tasks = sum(len(self.control.tasks.list(p)) for p in (self.parent, self.stranger))
        return store_counts(self.control), tasks


@pytest.fixture
def world(control: SubagentControl, provider: FakeProvider) -> Iterator[World]:
    parent = control.agents.register("parent-1", model=PARENT_MODEL)
    stranger = control.agents.register("parent-2", model=PARENT_MODEL)
    disposed = control.agents.register("parent-gone")
    disposed.dispose()
    idle = start_child(control, parent, label="idle")
    settle(control, idle.task_id, parent)
    theirs = start_child(control, stranger, label="theirs")
    settle(control, theirs.task_id, stranger)
    hold = threading.Event()
    plan = provider.plan(result_gate=hold)
    running = start_child(control, parent, label="running")
    assert plan.returned.wait(WAIT_S)
    # Publication writes the child after start returned: let it land before any example
    # takes its "before" snapshot of the store.
    eventually(lambda: is_durable(control, running.child_id), "the running child is published")
    yield World(
        control=control,
        provider=provider,
        parent=parent,
        stranger=stranger,
        disposed=disposed,
        running_child=running.child_id,
        running_task=running.task_id,
        idle_child=idle.child_id,
        settled_tasks=[idle.task_id],
        stranger_task=theirs.task_id,
    )
    hold.set()


def refused(world: World, exc: SubagentControlError, allowed: set[ErrorCode], before: Any) -> None:
    assert isinstance(exc.code, ErrorCode)
    event(f"refused {exc.code.value}")
    assert exc.code in allowed, repr(exc)
    assert exc.message
    assert world.state() == before, f"{exc!r} changed the store or the Tasks"


# -- start_continuable --------------------------------------------------------------------


@FUZZ
@given(
    provider=st.sampled_from(["fake", "fake", "fake", "fake", "no-such-provider", ""]),
    label=hostile_text(),
    prompt=st.lists(hostile_text(), max_size=3),
    persona=st.none() | hostile_text(),
    tool_filter=st.none() | any_value(),
    inputs=st.none() | any_value(),
    agent_provider=st.none() | hostile_text(),
    agent_model=st.none() | hostile_text(),
)
@pytest.mark.slow  # measured: 5 s under load (--durations)
def test_start_continuable_answers_any_spec_with_a_start_or_a_coded_refusal_that_writes_nothing(
    world: World,
    provider: str,
    label: str,
    prompt: list[str],
    persona: str | None,
    tool_filter: Any,
    inputs: Any,
    agent_provider: str | None,
    agent_model: str | None,
) -> None:
    control, parent = world.control, world.parent
    spec = ContinuableStartSpec(
        provider=provider,
        label=label,
        prompt=text(*prompt),
        parent=parent,
        persona=persona,
        tool_filter=tool_filter,
        inputs=inputs,
        agent_provider=agent_provider,
        agent_model=agent_model,
    )
    before = world.state()
    try:
        start = control.start_continuable(spec)
    except SubagentControlError as exc:
        refused(world, exc, START_REFUSALS, before)
        return
    snapshot = control.tasks.wait(start.task_id, timeout=WAIT_S, requester=parent)
    event(f"started, {snapshot.status.value}")
    assert snapshot.status.is_terminal
    if snapshot.status is TaskStatus.COMPLETED:
        assert control.store is not None
        loaded = control.store.load(start.child_id)
        descriptor = next(e.data for e in loaded.events if e.kind == EventKind.DESCRIPTOR)
        assert descriptor.get("inputs") == inputs
        assert descriptor.get("tool_filter") == tool_filter
        assert descriptor.get("persona") == persona
        assert loaded.events[1].data["text"] == "".join(prompt)
    else:
        # Failed before or at publication: a coded outcome, and nothing of the child left.
        assert snapshot.outcome is not None
        assert snapshot.outcome.code is not None, snapshot.outcome
        assert not is_durable(control, start.child_id)


# -- send_message --------------------------------------------------------------------------

PARENT_CHOICES = ["parent", "stranger", "disposed", "session-string", "none", "object"]
CHILD_CHOICES = ["running", "idle", "unknown", "empty", "too-long", "int", "none", "list"]


def pick_parent(world: World, choice: str) -> Any:
    return {
        "parent": world.parent,
        "stranger": world.stranger,
        "disposed": world.disposed,
        "session-string": world.parent.session_id,
        "none": None,
        "object": object(),
    }[choice]


def pick_child(world: World, choice: Any) -> Any:
    if not isinstance(choice, str) or choice not in CHILD_CHOICES:
        return choice
    return {
        "running": world.running_child,
        "idle": world.idle_child,
        "unknown": "00000000-0000-4000-8000-000000000000",
        "empty": "",
        "too-long": "c" * 300,
        "int": 12345,
        "none": None,
        "list": [world.idle_child],
    }[choice]


blocks = st.lists(hostile_text().map(lambda t: TextBlock(text=t)), max_size=3)
messages = mostly(
    blocks,
    st.one_of(
        st.lists(st.fixed_dictionaries({"text": hostile_text()}), max_size=2),
        st.lists(st.fixed_dictionaries({"text": any_value()}), min_size=1, max_size=2),
        st.lists(any_value(), min_size=1, max_size=2),
        hostile_text(),
        st.just(b"bytes"),
        st.none(),
        st.integers(),
    ),
)
sources = st.one_of(
    st.none(),
    st.builds(
        MessageSource,
        kind=st.sampled_from(["human", "coordinator", "user", "x" * 64]),
        sender_session_id=st.none() | hostile_text(),
    ),
    st.just("human"),
    st.just({"kind": "human"}),
)


@FUZZ
@given(
    who=st.sampled_from(["parent"] * 6 + PARENT_CHOICES),
    child=mostly(st.sampled_from(["running", "idle", *CHILD_CHOICES]), hostile_text()),
    message=messages,
    source=sources,
)
def test_send_message_answers_any_arguments_with_a_result_or_a_coded_refusal_that_writes_nothing(
    world: World, who: str, child: Any, message: Any, source: Any
) -> None:
    control = world.control
    requester = pick_parent(world, who)
    before = world.state()
    try:
        result = control.send_message(requester, pick_child(world, child), message, source)
    except SubagentControlError as exc:
        refused(world, exc, SEND_REFUSALS, before)
        return
    assert result.route in ("steered", "started")
    event(result.route)
    if result.route == "started":
        owner = requester.session_id
        snapshot = control.tasks.wait(result.task_id, timeout=WAIT_S, requester=owner)
        assert snapshot.status.is_terminal


# -- tasks.* --------------------------------------------------------------------------------

TASK_CHOICES = ["settled", "theirs", "unknown", "empty", "none", "int", "list"]
REQUESTER_CHOICES = ["parent", "stranger", "parent-string", "empty", "none", "int", "object"]


def pick_task(world: World, choice: Any) -> Any:
    if not isinstance(choice, str) or choice not in TASK_CHOICES:
        return choice
    return {
        "settled": world.settled_tasks[0],
        "theirs": world.stranger_task,
        "unknown": "00000000-0000-4000-8000-000000000000",
        "empty": "",
        "none": None,
        "int": 7,
        "list": [world.running_task],
    }[choice]


def pick_requester(world: World, choice: str) -> Any:
    return {
        "parent": world.parent,
        "stranger": world.stranger,
        "parent-string": world.parent.session_id,
        "empty": "",
        "none": None,
        "int": 1,
        "object": object(),
    }[choice]


@FUZZ
@given(
    operation=st.sampled_from(["get", "wait", "kill", "output", "list", "drain_notices"]),
    task=st.one_of(st.sampled_from(["settled", "theirs", *TASK_CHOICES]), hostile_text()),
    who=st.sampled_from(["parent", "parent", "stranger", *REQUESTER_CHOICES]),
)
def test_task_operations_answer_any_id_and_requester_with_a_result_or_a_coded_refusal(
    world: World, operation: str, task: Any, who: str
) -> None:
    tasks = world.control.tasks
    task_id, requester = pick_task(world, task), pick_requester(world, who)
    calls = {
        "get": lambda: tasks.get(task_id, requester=requester),
        "wait": lambda: tasks.wait(task_id, timeout=0.01, requester=requester),
        "kill": lambda: tasks.kill(task_id, requester=requester),
        "output": lambda: tasks.output(task_id, requester=requester),
        "list": lambda: tasks.list(requester),
        "drain_notices": lambda: tasks.drain_notices(requester),
    }
    before = world.state()
    try:
        calls[operation]()
    except SubagentControlError as exc:
        refused(world, exc, TASK_REFUSALS, before)
        return
    event(f"{operation} answered")
    assert world.state() == before
    # Whatever was asked, the running child was not touched by it.
    assert tasks.get(world.running_task, requester=world.parent).status is TaskStatus.RUNNING


# -- store.append ---------------------------------------------------------------------------

well_formed = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["assistant/message", "tool/result", "x" * 200]),
        "turn": st.integers(min_value=0, max_value=2**31),
        "data": json_values(),
    },
    optional={"source": st.just({"kind": "human", "sender_session_id": "parent-1"})},
)
event_fields = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.one_of(hostile_text(), st.integers(), st.none()),
        "turn": st.one_of(
            st.integers(min_value=-5, max_value=2**70), st.booleans(), st.text(max_size=3)
        ),
        "data": any_value(),
        "source": st.one_of(
            st.none(), st.just({"kind": "human"}), st.just({"kind": ""}), any_value()
        ),
        "extra": json_values(),
    },
)
event_batches = mostly(
    st.lists(well_formed, max_size=3),
    st.one_of(
        st.lists(st.one_of(well_formed, event_fields), max_size=3),
        st.lists(event_fields, max_size=3),
        st.lists(any_value(), min_size=1, max_size=2),
        any_value(),
    ),
    2,
)


@FUZZ
@given(
    child=st.one_of(
        st.sampled_from(["idle", "idle", "idle", "unknown", "empty", "int", "none"]),
        hostile_text(),
    ),
    batch=event_batches,
)
def test_store_append_answers_any_batch_with_stored_events_or_a_coded_refusal_that_writes_nothing(
    world: World, child: Any, batch: Any
) -> None:
    store = world.control.store
    assert store is not None
    child_id = pick_child(world, child)
    before = world.state()
    try:
        stored = store.append(child_id, batch)
    except SubagentControlError as exc:
        refused(world, exc, APPEND_REFUSALS, before)
        return
    event("appended")
    # Accepted: every event of the batch is there, contiguous, and reads back as written.
    assert child_id == world.idle_child
    loaded = store.load(child_id).events
    assert [e.seq for e in loaded] == list(range(1, len(loaded) + 1))
    if stored:
        assert loaded[-len(stored) :] == stored
