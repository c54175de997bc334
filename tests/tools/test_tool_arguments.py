"""Bad tool calls are error results that change nothing: no Task, no child, no transcript write.

The hypothesis tests throw random JSON values, random strings and near-miss argument
objects at every tool, with one settled child in place (so a stray write would show), and
check each call against an independent oracle of what is valid.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane import SubagentControlError, TextBlock
from controlplane.tools import MAX_MESSAGE_CHARS, ToolHandlers
from tests.support import TOOL_NAMES

from .conftest import Rig, Started

ARGUMENT_NAMES = {
    "subagent": ["description", "prompt"],
    "send_message": ["subagent_id", "message"],
    "task_output": ["task_id", "wait", "timeout_s"],
    "task_kill": ["task_id"],
    "task_list": [],
    "list_agents": [],
    "set_budget": ["subagent_id", "tokens", "cost", "model_calls", "tool_calls", "seconds"],
    "answer": ["request_id", "allow", "note"],
}

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def settled(rig: Rig) -> Started:
    """One child, settled, so nothing changes on its own while bad calls are made."""
    started = rig.start()
    rig.settle(started.task_id)
    return started


# -- the oracle --------------------------------------------------------------------------


def _text_ok(value: object, limit: int) -> bool:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= limit


def _id_ok(value: object) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 200


def is_valid(name: str, arguments: object) -> bool:
    """Whether ``arguments`` (already decoded) are valid for ``name``, per SPEC §7."""
    if not isinstance(arguments, dict):
        return False
    if not set(arguments) <= set(ARGUMENT_NAMES[name]):
        return False
    if name == "subagent":
        return _text_ok(arguments.get("description"), 1000) and _text_ok(
            arguments.get("prompt"), MAX_MESSAGE_CHARS
        )
    if name == "send_message":
        return _id_ok(arguments.get("subagent_id")) and _text_ok(
            arguments.get("message"), MAX_MESSAGE_CHARS
        )
    if name == "set_budget":
        return _id_ok(arguments.get("subagent_id")) and _limits_ok(arguments)
    if name == "answer":
        note = arguments.get("note")
        return (
            _id_ok(arguments.get("request_id"))
            and isinstance(arguments.get("allow"), bool)
            and (note is None or (isinstance(note, str) and len(note) <= MAX_MESSAGE_CHARS))
        )
    if name in ("task_output", "task_kill"):
        if not _id_ok(arguments.get("task_id")):
            return False
        wait = arguments.get("wait", False)
        timeout = arguments.get("timeout_s", 30.0)
        return (
            isinstance(wait, bool)
            and isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and 0 < timeout <= 600
        )
    return True


def _limits_ok(arguments: dict[Any, Any]) -> bool:
    given = [name for name in ("tokens", "cost", "model_calls", "tool_calls", "seconds")
             if arguments.get(name) is not None]  # fmt: skip
    for name in given:
        value = arguments[name]
        whole = name in ("tokens", "model_calls", "tool_calls")
        kinds = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return False
        if not math.isfinite(value) or value <= 0:
            return False
    return bool(given)


def decoded(arguments: object) -> object:
    """What the tool sees once JSON text is parsed (a sentinel for text that is not JSON)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments, parse_constant=lambda token: _NOT_JSON)
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


# -- strategies --------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", " ", "\n\t", "\x1c", "\u3000"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@st.composite
def near_misses(draw: st.DrawFn, name: str) -> dict[Any, Any]:
    """Objects shaped like the tool's arguments: right, wrong and unknown keys and values."""
    keys = st.sampled_from(ARGUMENT_NAMES[name] or ["x"]) | st.text(max_size=12)
    if draw(st.booleans()):
        keys = keys | st.integers()  # a Python mapping may carry non-string keys
    return draw(st.dictionaries(keys, json_values, max_size=4))


def as_call(arguments: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Each value as a Python object or as its JSON text."""
    return arguments.flatmap(lambda value: st.sampled_from([value, _dumps_or_keep(value)]))


def _dumps_or_keep(value: object) -> object:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return value


garbage = st.text(max_size=40) | st.binary(max_size=20).map(lambda b: b.decode("latin-1"))


# -- the property ------------------------------------------------------------------------


def assert_bad_call_changes_nothing(rig: Rig, name: str, arguments: object) -> None:
    before = rig.state()

    result = rig.tools.call(name, arguments)

    assert result.is_error, (name, arguments, result.text)
    assert result.text.startswith("error ["), result.text
    assert rig.state() == before
    if not is_valid(name, decoded(arguments)):
        assert result.code == "INVALID_INPUT", result.text


@pytest.mark.parametrize("name", TOOL_NAMES)
@SETTINGS
@given(data=st.data())
@pytest.mark.slow  # measured: 33 s under load (--durations)
def test_random_argument_objects_are_errors_that_change_nothing(
    rig: Rig, settled: Started, name: str, data: st.DataObject
) -> None:
    arguments = data.draw(as_call(near_misses(name)))
    # Valid starts and the empty listings' `{}` would rightly succeed.
    succeeds_rightly = name in ("subagent", "task_list", "list_agents")
    if succeeds_rightly and is_valid(name, decoded(arguments)):
        return
    assert_bad_call_changes_nothing(rig, name, arguments)


@pytest.mark.parametrize("name", TOOL_NAMES)
@SETTINGS
@given(arguments=as_call(json_values.filter(lambda value: not isinstance(value, dict))))
@pytest.mark.slow  # measured: 56 s under load (--durations)
def test_arguments_that_are_not_a_json_object_are_invalid_input(
    rig: Rig, settled: Started, name: str, arguments: object
) -> None:
    assert_bad_call_changes_nothing(rig, name, arguments)


@pytest.mark.parametrize("name", TOOL_NAMES)
@SETTINGS
@given(text=garbage)
def test_garbage_argument_text_is_invalid_input(
    rig: Rig, settled: Started, name: str, text: str
) -> None:
    if isinstance(decoded(text), dict) and is_valid(name, decoded(text)):
        return
    assert_bad_call_changes_nothing(rig, name, text)


@SETTINGS
@given(name=st.text(max_size=30).filter(lambda n: n not in TOOL_NAMES), arguments=json_values)
def test_unknown_tool_names_are_invalid_input_naming_the_real_tools(
    rig: Rig, settled: Started, name: str, arguments: object
) -> None:
    before = rig.state()

    result = rig.tools.call(name, arguments)

    assert result.code == "INVALID_INPUT"
    assert "subagent, send_message, task_output, task_kill, task_list, list_agents" in result.text
    assert rig.state() == before


# -- the named cases, with their messages --------------------------------------------------

LONG = "x" * (MAX_MESSAGE_CHARS + 1)


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("subagent", {"description": "x"}, "prompt is required"),
        ("subagent", {"description": "x", "prompt": "go", "model": "big"}, "model is not an"),
        ("subagent", {"description": "x", "prompt": 7}, "prompt must be a string"),
        ("subagent", {"description": "x", "prompt": ""}, "prompt must not be empty"),
        ("subagent", {"description": "x", "prompt": " \n\t "}, "prompt must contain"),
        ("subagent", {"description": "  ", "prompt": "go"}, "description must contain"),
        ("subagent", {"description": "x", "prompt": LONG}, "at most 100,000 characters"),
        ("send_message", {"subagent_id": "{child}", "message": ""}, "message must not be"),
        ("send_message", {"subagent_id": "{child}", "message": "\u3000\n"}, "must contain"),
        ("send_message", {"subagent_id": "{child}", "message": LONG}, "at most 100,000"),
        ("send_message", {"subagent_id": "{child}"}, "message is required"),
        ("send_message", {"subagent_id": 1, "message": "hi"}, "subagent_id must be a string"),
        ("task_output", {"task_id": "{task}", "wait": "yes"}, "wait must be true or false"),
        ("task_output", {"task_id": "{task}", "wait": 1}, "wait must be true or false"),
        ("task_output", {"task_id": "{task}", "timeout_s": 0}, "greater than 0"),
        ("task_output", {"task_id": "{task}", "timeout_s": 601}, "at most 600"),
        ("task_output", {"task_id": "{task}", "timeout_s": "5"}, "timeout_s must be a number"),
        ("task_output", {"task_id": "{task}", "timeout_s": True}, "timeout_s must be a number"),
        ("task_output", '{"task_id": "{task}", "timeout_s": NaN}', "not valid JSON"),
        ("task_output", '{"task_id": "{task}", "timeout_s": Infinity}', "not valid JSON"),
        ("task_kill", {}, "task_id is required"),
        ("task_kill", {"task_id": ""}, "task_id must not be empty"),
        ("task_list", {"all": True}, "all is not an argument"),
        ("task_list", "", "not valid JSON"),
        ("task_list", "null", "must be a JSON object, not null"),
        ("list_agents", "[]", "must be a JSON object, not an array"),
        ("list_agents", None, "must be a JSON object"),
        ("list_agents", "{'single': 'quotes'}", "not valid JSON"),
        ("list_agents", "[" * 100_000, "not valid JSON"),
    ],
)
def test_named_bad_arguments_are_invalid_input_that_change_nothing(
    rig: Rig, settled: Started, name: str, arguments: object, says: str
) -> None:
    arguments = _fill(arguments, settled)

    assert_bad_call_changes_nothing(rig, name, arguments)

    result = rig.tools.call(name, arguments)
    assert says in result.text
    assert "nothing was done" in result.text.lower()


def _fill(arguments: object, started: Started) -> object:
    if isinstance(arguments, str):
        return arguments.replace("{child}", started.child_id).replace("{task}", started.task_id)
    if isinstance(arguments, dict):
        return {key: _fill(value, started) for key, value in arguments.items()}
    return arguments


def test_oversized_argument_text_is_refused_before_parsing(rig: Rig, settled: Started) -> None:
    arguments = json.dumps({"description": "x", "prompt": "y" * 2_000_000})

    assert_bad_call_changes_nothing(rig, "subagent", arguments)

    assert "over the limit" in rig.tools.call("subagent", arguments).text


def test_a_message_at_the_limit_is_accepted(rig: Rig, settled: Started) -> None:
    text = rig.ok(
        "send_message", {"subagent_id": settled.child_id, "message": "m" * MAX_MESSAGE_CHARS}
    )

    assert text.startswith("message started task ")


def test_the_python_api_accepts_an_empty_follow_up_that_the_tool_refuses(
    rig: Rig, settled: Started
) -> None:
    rig.error("send_message", {"subagent_id": settled.child_id, "message": ""}, "INVALID_INPUT")

    result = rig.control.send_message(rig.parent, settled.child_id, [TextBlock(text="")])

    assert result.route == "started"


def test_argument_errors_show_the_call_to_make_instead(rig: Rig) -> None:
    result = rig.tools.call("task_output", {"id": "t-1"})

    assert result.text == (
        "error [INVALID_INPUT]: invalid arguments for task_output: task_id is required; "
        "id is not an argument of this tool. Nothing was done; call task_output again with "
        '{"task_id": string, "wait"?: boolean, "timeout_s"?: number}'
    )


def test_handlers_refuse_a_parent_that_is_not_an_agent_handle(rig: Rig) -> None:
    with pytest.raises(SubagentControlError, match="AgentHandle"):
        ToolHandlers(rig.control, "parent-1")  # type: ignore[arg-type]
