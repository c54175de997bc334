"""The face a user holds: ``control.tasks`` has the documented verbs only, a started child
comes back as a `ChildHandle` bound to its parent (``send``, ``wait``, ``kill``,
``transcript``, ``usage``), made again for an existing child after a restart, and a plain
``str`` is a message wherever one is taken — bad input a coded error that changes nothing.
On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    CancelSignal,
    ChildMeta,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.aio import AsyncSubagentControl
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    MakeControl,
    inbound,
    raises,
    wait_published,
)

TASK_VERBS = {"drain_notices", "get", "kill", "list", "on_done", "output", "start", "wait"}
"""SPEC's verbs of ``control.tasks``: a new public name on it is a decision, made here."""

SPENT = Usage(input_tokens=5, output_tokens=1)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def scripted(control: SubagentControl) -> SubagentControl:
    """``control`` with an ``inprocess`` child that answers "first", then "second", each
    model call spending `SPENT`."""
    control.providers.register(InProcessProvider(ScriptedModel(["first", "second"], usage=SPENT)))
    return control


def public_names(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def footprint(control: SubagentControl, parent: AgentHandle) -> tuple[Any, ...]:
    """What a refused call must leave as it was: the parent's Tasks, its children and
    their transcripts."""
    assert control.store is not None
    children = control.store.list_children(parent.session_id)
    return (
        [(t.id, t.status) for t in control.tasks.list(parent)],
        [(c.child_id, len(control.store.load(c.child_id).events)) for c in children],
    )


# -- control.tasks ---------------------------------------------------------------------------


def test_control_tasks_has_the_documented_verbs_only(control: SubagentControl) -> None:
    assert public_names(control.tasks) == TASK_VERBS
    for internal in ("settle", "release", "park", "meter", "take_over_parked", "fence", "flush"):
        assert not hasattr(control.tasks, internal), internal


def test_control_tasks_start_refuses_without_a_surface(make_control: MakeControl) -> None:
    control = make_control(task_tools=False)
    parent = control.agents.register("parent-1")
    with raises(ErrorCode.NO_CONTROL_SURFACE):
        control.tasks.start(label="x", owner=parent, child_id=None, signal=CancelSignal())
    assert control.tasks.list(parent) == []


# -- the handle --------------------------------------------------------------------------------


def test_a_started_handle_waits_reads_its_transcript_and_usage_and_resumes_on_a_str(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    child = scripted.start(parent, "research  X")
    assert child.parent is parent
    first = child.wait(timeout=WAIT_S)
    assert (first.status, first.label, first.outcome and first.outcome.output) == (
        TaskStatus.COMPLETED,
        "research X",
        "first",
    )
    assert first.id == child.task_id
    assert inbound(child.transcript(), "research  X")
    assert child.usage().input_tokens == SPENT.input_tokens

    sent = child.send("also Y")
    assert sent.route == "started"
    assert child.task_id == sent.task_id != first.id
    second = child.wait(timeout=WAIT_S)
    assert second.outcome is not None
    assert second.outcome.output == "second"
    stored = child.transcript()
    assert [e.kind for e in inbound(stored, "also Y")] == [EventKind.USER_MESSAGE]
    assert child.usage().input_tokens == 2 * SPENT.input_tokens
    assert stored == scripted.store.load(child.child_id).events  # type: ignore[union-attr]


def test_a_handle_steers_its_running_turn_then_kills_it(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> None:
    plan = provider.plan(result_gate=hold)
    child = control.start(parent, "go", provider="fake", label="steered")
    assert plan.returned.wait(WAIT_S)
    wait_published(control, child.child_id)
    started_task = child.task_id

    steered = child.send("turn left")
    assert (steered.route, steered.task_id) == ("steered", started_task)
    assert [s.message[0].text for s in provider.steers] == ["turn left"]

    child.kill()
    killed = child.wait(timeout=WAIT_S)
    assert (killed.id, killed.status) == (started_task, TaskStatus.KILLED)
    assert [e.kind for e in inbound(child.transcript(), "turn left")] == [
        EventKind.STEERING_MESSAGE
    ]


def test_a_handle_made_again_after_a_restart_follows_the_childs_newest_task(
    make_control: MakeControl, url: str
) -> None:
    first = make_control()
    first.providers.register(InProcessProvider(ScriptedModel(["one"], usage=SPENT)))
    parent = first.agents.register("parent-1", model=PARENT_MODEL)
    child = first.start(parent, "remember me")
    child.wait(timeout=WAIT_S)
    child_id, task_id = child.child_id, child.task_id
    first.close()

    again = make_control()
    again.providers.register(InProcessProvider(ScriptedModel(["two"], usage=SPENT)))
    parent = again.agents.register("parent-1", model=PARENT_MODEL)
    stranger = again.agents.register("parent-2", model=PARENT_MODEL)
    handle = again.child(parent, child_id)
    assert (handle.child_id, handle.task_id) == (child_id, task_id)
    assert handle.wait(timeout=WAIT_S).status is TaskStatus.COMPLETED
    assert handle.usage() == Usage(input_tokens=5, output_tokens=1, model_calls=1)
    assert handle.send("and now?").route == "started"
    assert handle.wait(timeout=WAIT_S).outcome.output == "two"  # type: ignore[union-attr]
    assert inbound(handle.transcript(), "remember me")
    assert inbound(handle.transcript(), "and now?")

    for who, which in ((stranger, child_id), (parent, "no-such-child")):
        with raises(ErrorCode.CHILD_NOT_FOUND):
            again.child(who, which)
    with raises(ErrorCode.INVALID_INPUT):
        again.child(parent, None)  # type: ignore[arg-type]
    with raises(ErrorCode.UNAUTHORIZED):
        again.child("parent-1", child_id)  # type: ignore[arg-type]


def test_a_handle_of_a_child_with_no_task_of_the_session_refuses_wait_and_kill(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    assert scripted.store is not None
    scripted.store.create_child(
        ChildMeta(child_id="made-by-hand", parent_session="parent-1", depth=1, seed_length=0)
    )
    handle = scripted.child(parent, "made-by-hand")
    assert handle.task_id is None
    for verb in (handle.wait, handle.kill):
        with raises(ErrorCode.TASK_NOT_FOUND):
            verb()
    assert handle.transcript() == []
    assert handle.usage() == Usage.zero()
    assert handle.send("wake up").route == "started"  # a resume: then it follows that Task
    assert handle.wait(timeout=WAIT_S).status is TaskStatus.FAILED  # no descriptor to resume


def test_a_handle_reads_empty_until_its_child_is_durable_and_kills_its_start(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider, hold: threading.Event
) -> None:
    plan = provider.plan(start_gate=hold)
    child = control.start(parent, "go", provider="fake")
    assert plan.entered.wait(WAIT_S)
    assert (child.transcript(), child.usage()) == ([], Usage.zero())
    child.kill()
    assert child.wait(timeout=WAIT_S).status is TaskStatus.KILLED


# -- str messages, and what is not a message ---------------------------------------------------


def test_a_str_is_a_message_for_a_spec_a_send_and_a_start(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    started = scripted.start_continuable(
        ContinuableStartSpec(provider="inprocess", label="s", prompt="hello", parent=parent)
    )
    scripted.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    sent = scripted.send_message(parent, started.child_id, "follow up")
    scripted.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert scripted.store is not None
    stored = scripted.store.load(started.child_id).events
    assert inbound(stored, "hello")
    assert inbound(stored, "follow up")
    assert ContinuableStartSpec(provider="p", label="l", prompt="hi", parent=parent).prompt == [
        TextBlock(text="hi")
    ]


def test_a_str_with_a_nul_is_a_message_its_derived_label_drops(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    # Message text may hold NUL (it is stored as JSON); the Task label derived from it may
    # not (PostgreSQL's text columns refuse it): it was a STORE_UNAVAILABLE on PostgreSQL.
    child = scripted.start(parent, "nul \x00 first")
    assert child.wait(timeout=WAIT_S).label == "nul first"
    sent = child.send("nul \x00 again")
    assert scripted.tasks.get(sent.task_id, requester=parent).label == "nul again"
    child.wait(timeout=WAIT_S)
    assert inbound(child.transcript(), "nul \x00 again")


BAD_MESSAGES = [
    pytest.param("", id="empty-str"),
    pytest.param("  \n", id="blank-str"),
    pytest.param(None, id="none"),
    pytest.param(42, id="int"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(["a str in a list"], id="list-of-str"),
    pytest.param([TextBlock(text="ok"), 7], id="list-with-an-int"),
    pytest.param({"text": "a dict"}, id="dict"),
]


@pytest.mark.parametrize("bad", BAD_MESSAGES)
def test_what_is_not_a_message_is_refused_with_a_code_and_changes_nothing(
    scripted: SubagentControl, parent: AgentHandle, bad: object
) -> None:
    child = scripted.start(parent, "first")
    child.wait(timeout=WAIT_S)
    before = footprint(scripted, parent)
    calls = {
        "send_message": lambda: scripted.send_message(parent, child.child_id, bad),  # type: ignore[arg-type]
        "handle.send": lambda: child.send(bad),  # type: ignore[arg-type]
        "start": lambda: scripted.start(parent, bad),  # type: ignore[arg-type]
    }
    for name, call in calls.items():
        with raises(ErrorCode.INVALID_INPUT):
            call()
        assert footprint(scripted, parent) == before, name
    assert child.task_id == before[0][0][0]  # a refused send leaves the handle as it was


def test_a_start_with_an_unknown_option_is_refused_and_starts_nothing(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="colour"):
        scripted.start(parent, "paint", colour="red")
    with raises(ErrorCode.UNKNOWN_PROVIDER):
        scripted.start(parent, "paint", provider="nobody")
    assert scripted.tasks.list(parent) == []
    with pytest.raises(ValueError, match="prompt"):
        ContinuableStartSpec(provider="p", label="l", prompt="", parent=parent)


def test_the_async_front_takes_a_str_message_too(
    scripted: SubagentControl, parent: AgentHandle
) -> None:
    child = scripted.start(parent, "first")
    child.wait(timeout=WAIT_S)
    aio = AsyncSubagentControl(scripted)

    async def follow_up() -> TaskStatus:
        sent = await aio.send_message(parent, child.child_id, "from a coroutine")
        return (await aio.wait(sent.task_id, timeout=WAIT_S, requester=parent)).status

    assert asyncio.run(follow_up()) is TaskStatus.COMPLETED
    assert inbound(child.transcript(), "from a coroutine")
