"""The six tools with good arguments: exact model-facing texts and their effects."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    TaskStatus,
)
from controlplane.models import ModelReply
from controlplane.tools import INTERNAL_ERROR, ToolHandlers
from tests.support import TOOL_NAMES

from .conftest import PARENT, WAIT_S, MakeRig, Rig


@pytest.fixture
def url(store_url: str) -> str:
    """These behaviours involve the store: run them on SQLite and PostgreSQL."""
    return store_url


# -- definitions ----------------------------------------------------------------------------


def test_definitions_name_the_eight_tools_with_strict_object_schemas(rig: Rig) -> None:
    definitions = rig.tools.definitions()

    assert [d["name"] for d in definitions] == TOOL_NAMES
    arguments = {d["name"]: d["parameters"] for d in definitions}
    assert {name: set(schema["properties"]) for name, schema in arguments.items()} == {
        "subagent": {"description", "prompt"},
        "send_message": {"subagent_id", "message"},
        "task_output": {"task_id", "wait", "timeout_s"},
        "task_kill": {"task_id"},
        "task_list": set(),
        "list_agents": set(),
        "set_budget": {"subagent_id", "tokens", "cost", "model_calls", "tool_calls", "seconds"},
        "answer": {"request_id", "allow", "note"},
    }
    for definition in definitions:
        assert set(definition) == {"name", "description", "parameters"}
        assert definition["description"]
        schema = definition["parameters"]
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        json.dumps(schema)  # plain JSON, ready for any model API
    assert arguments["subagent"]["required"] == ["description", "prompt"]
    assert arguments["send_message"]["required"] == ["subagent_id", "message"]
    assert arguments["task_output"]["required"] == ["task_id"]
    assert arguments["set_budget"]["required"] == ["subagent_id"]
    assert arguments["answer"]["required"] == ["request_id", "allow"]
    timeout = arguments["task_output"]["properties"]["timeout_s"]
    assert timeout["type"] == "number"
    assert timeout["exclusiveMinimum"] == 0
    assert timeout["maximum"] == 600
    assert arguments["task_output"]["properties"]["wait"]["type"] == "boolean"
    assert arguments["subagent"]["properties"]["prompt"]["maxLength"] == 100_000


def test_definitions_are_fresh_copies_a_harness_may_change(rig: Rig) -> None:
    first = rig.tools.definitions()
    first[0]["parameters"]["properties"].clear()
    first.clear()

    assert rig.tools.definitions()[0]["parameters"]["properties"] != {}


# -- subagent ----------------------------------------------------------------------------


def test_subagent_starts_a_child_in_the_background_and_reports_both_ids(gated: Rig) -> None:
    started = gated.start(description="research X", prompt="find X")

    task = gated.control.tasks.get(started.task_id, requester=gated.parent)
    assert task.status is TaskStatus.RUNNING
    assert task.label == "research X"
    assert task.child_id == started.child_id
    assert gated.model.wait_for_calls(1, WAIT_S)
    assert gated.model.calls[0].messages[-1].text == "find X"


def test_subagent_output_is_read_with_task_output_and_its_status(rig: Rig) -> None:
    started = rig.start()

    text = rig.ok("task_output", {"task_id": started.task_id, "wait": True, "timeout_s": WAIT_S})

    assert text == "the answer\n[status: completed]"


def test_subagent_arguments_may_come_as_json_text(rig: Rig) -> None:
    text = rig.ok("subagent", json.dumps({"description": "as json", "prompt": "go"}))

    assert text.startswith("started subagent ")
    assert [task.label for task in rig.control.tasks.list(rig.parent)] == ["as json"]


def test_subagent_for_a_disposed_parent_is_an_error_that_starts_nothing(rig: Rig) -> None:
    rig.parent.dispose()

    rig.error("subagent", {"description": "x", "prompt": "go"}, "UNAUTHORIZED")

    assert rig.control.tasks.list(rig.parent) == []


def test_subagent_with_an_unregistered_provider_is_an_error_the_model_can_read(
    make_rig: MakeRig,
) -> None:
    base = make_rig()
    tools = ToolHandlers(base.control, base.parent, provider="nowhere")

    result = tools.call("subagent", {"description": "x", "prompt": "go"})

    assert result.is_error
    assert result.text.startswith("error [UNKNOWN_PROVIDER]: ")
    assert "do not retry" in result.text


# -- list_agents ---------------------------------------------------------------------------


def test_list_agents_without_children_says_so(rig: Rig) -> None:
    assert rig.ok("list_agents", {}) == "(no subagents)"


def test_list_agents_lists_a_child_from_the_moment_subagent_returns(gated: Rig) -> None:
    started = gated.start(description="research X")

    assert gated.ok("list_agents", {}) == f"{started.child_id} [running] — research X"


def test_list_agents_shows_a_settled_child_as_ready_with_its_start_label(rig: Rig) -> None:
    first = rig.start(description="research X")
    second = rig.start(description="write Y")
    rig.settle(first.task_id)
    rig.settle(second.task_id)

    # SPEC §7's line, then what each spent: one model call, whose tokens were not reported.
    assert rig.ok("list_agents", {}).splitlines() == [
        f"{first.child_id} [ready] — research X — 0 tokens, 1 model call",
        f"{second.child_id} [ready] — write Y — 0 tokens, 1 model call",
    ]


def test_list_agents_shows_only_the_calling_parents_children(make_rig: MakeRig) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control)
    theirs.start(description="theirs")

    assert mine.ok("list_agents", {}) == "(no subagents)"


# -- send_message -------------------------------------------------------------------------


def test_send_message_to_an_idle_child_starts_a_task_continuing_it(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)

    text = rig.ok("send_message", {"subagent_id": started.child_id, "message": "and then?"})

    tasks = rig.control.tasks.list(rig.parent)
    assert len(tasks) == 2
    follow_up = tasks[1]
    assert text == f"message started task {follow_up.id} continuing subagent {started.child_id}"
    assert follow_up.child_id == started.child_id
    assert rig.settle(follow_up.id).outcome is not None


def test_send_message_to_a_running_child_is_delivered_into_its_task(gated: Rig) -> None:
    started = gated.start()
    assert gated.model.wait_for_calls(1, WAIT_S)

    text = gated.ok("send_message", {"subagent_id": started.child_id, "message": "also Z"})

    assert text == f"message delivered to running task {started.task_id}"
    assert [task.id for task in gated.control.tasks.list(gated.parent)] == [started.task_id]
    gated.model.release(2)
    assert gated.settle(started.task_id).status is TaskStatus.COMPLETED


def test_send_message_records_the_parent_as_coordinator_in_the_transcript(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)
    rig.ok("send_message", {"subagent_id": started.child_id, "message": "follow-up"})
    rig.settle(rig.control.tasks.list(rig.parent)[-1].id)

    inbound = [
        event
        for event in rig.events(started.child_id)
        if event.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
        and "follow-up" in json.dumps(event.data)
    ]
    assert len(inbound) == 1
    assert inbound[0].source is not None
    assert inbound[0].source.kind == "coordinator"
    assert inbound[0].source.sender_session_id == PARENT


def test_send_message_to_another_parents_child_changes_nothing(make_rig: MakeRig) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control)
    started = theirs.start()
    theirs.settle(started.task_id)
    before = len(theirs.events(started.child_id))

    result = mine.error(
        "send_message", {"subagent_id": started.child_id, "message": "hi"}, "CHILD_NOT_FOUND"
    )

    assert "list_agents" in result.text
    assert mine.control.tasks.list(mine.parent) == []
    assert len(theirs.control.tasks.list(theirs.parent)) == 1
    assert len(theirs.events(started.child_id)) == before


# -- task_output ---------------------------------------------------------------------------


def test_task_output_of_a_running_task_shows_what_there_is_and_its_status(gated: Rig) -> None:
    started = gated.start()

    assert gated.ok("task_output", {"task_id": started.task_id}) == "\n[status: running]"


def test_task_output_waiting_past_its_timeout_reports_running_not_an_error(gated: Rig) -> None:
    started = gated.start()

    text = gated.ok("task_output", {"task_id": started.task_id, "wait": True, "timeout_s": 0.05})

    assert text.endswith("[status: running]")


def test_task_output_of_a_failed_task_shows_its_detail_in_place_of_the_output(
    make_rig: MakeRig,
) -> None:
    rig = make_rig([ModelReply(text="partial", stop_reason="refusal")])
    started = rig.start()
    snapshot = rig.settle(started.task_id)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.detail

    text = rig.ok("task_output", {"task_id": started.task_id})

    assert text == f"{snapshot.outcome.detail}\n[status: failed]"
    assert "refusal" in text


def test_task_output_of_an_unknown_task_tells_the_model_not_to_retry_that_id(rig: Rig) -> None:
    result = rig.error("task_output", {"task_id": "no-such-task"}, "TASK_NOT_FOUND")

    assert "do not retry this id" in result.text


def test_task_output_of_another_parents_task_is_not_found(make_rig: MakeRig) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control)
    started = theirs.start()

    mine.error("task_output", {"task_id": started.task_id, "wait": True}, "TASK_NOT_FOUND")


# -- task_kill -----------------------------------------------------------------------------


def test_task_kill_stops_a_running_task_and_confirms(gated: Rig) -> None:
    started = gated.start()

    text = gated.ok("task_kill", {"task_id": started.task_id})

    assert started.task_id in text
    assert gated.settle(started.task_id).status is TaskStatus.KILLED
    assert gated.ok("task_output", {"task_id": started.task_id}).endswith("[status: killed]")


def test_task_kill_of_a_settled_task_changes_nothing_and_says_so(rig: Rig) -> None:
    started = rig.start()
    rig.settle(started.task_id)

    text = rig.ok("task_kill", {"task_id": started.task_id})

    assert "already completed" in text
    assert rig.settle(started.task_id).status is TaskStatus.COMPLETED


def test_task_kill_of_another_parents_task_is_not_found_and_kills_nothing(
    make_rig: MakeRig,
) -> None:
    mine = make_rig()
    theirs = make_rig(session_id="parent-2", control=mine.control, gated=True)
    started = theirs.start()

    mine.error("task_kill", {"task_id": started.task_id}, "TASK_NOT_FOUND")

    status = theirs.control.tasks.get(started.task_id, requester=theirs.parent).status
    assert status is TaskStatus.RUNNING


# -- task_list -----------------------------------------------------------------------------


def test_task_list_without_tasks_says_so(rig: Rig) -> None:
    assert rig.ok("task_list", {}) == "(no tasks)"


def test_task_list_shows_one_line_per_task_with_id_status_and_label(gated: Rig) -> None:
    first = gated.start(description="research X")
    second = gated.start(description="write Y")
    gated.ok("task_kill", {"task_id": second.task_id})
    gated.settle(second.task_id)

    lines = gated.ok("task_list", {}).splitlines()

    assert len(lines) == 2
    assert lines[0].startswith(f"{first.task_id} [running] — research X")
    assert lines[1].startswith(f"{second.task_id} [killed] — write Y")


# -- failures never reach the harness ----------------------------------------------------


class _BrokenArguments(Mapping[str, object]):
    """A harness bug: arguments that blow up when read."""

    def __getitem__(self, key: str) -> object:
        raise RuntimeError("the harness broke its own arguments")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("the harness broke its own arguments")

    def __len__(self) -> int:
        return 1


def test_an_unexpected_exception_becomes_an_internal_error_result(rig: Rig) -> None:
    result = rig.tools.call("task_list", _BrokenArguments())

    assert result.is_error
    assert result.code == INTERNAL_ERROR
    assert result.text.startswith(f"error [{INTERNAL_ERROR}]: ")
    assert "RuntimeError" in result.text


def test_tools_on_a_closed_control_plane_answer_with_an_error(rig: Rig) -> None:
    rig.control.close()

    result = rig.tools.call("subagent", {"description": "x", "prompt": "go"})

    assert result.is_error
    assert result.text.startswith(f"error [{ErrorCode.CLOSED.value}]: ")


# -- after a restart -------------------------------------------------------------------------


def test_after_a_restart_the_tools_find_the_child_in_the_store(make_rig: MakeRig) -> None:
    before = make_rig()
    started = before.start(description="research X")
    before.settle(started.task_id)
    before.control.close()

    after = make_rig(["resumed answer"])

    assert after.ok("list_agents", {}) == (
        f"{started.child_id} [ready] — research X — 0 tokens, 1 model call"  # from the store
    )
    text = after.ok("send_message", {"subagent_id": started.child_id, "message": "go on"})
    first, task = after.control.tasks.list(after.parent)  # Tasks are kept in the store
    assert first.id == started.task_id
    assert text == f"message started task {task.id} continuing subagent {started.child_id}"
    output = after.ok("task_output", {"task_id": task.id, "wait": True, "timeout_s": WAIT_S})
    assert output == "resumed answer\n[status: completed]"
    earlier = after.ok("task_output", {"task_id": started.task_id})
    assert earlier.endswith("\n[status: completed]")
