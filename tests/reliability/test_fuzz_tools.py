"""Hostile tool calls (SPEC §7): whatever name and arguments a model sends — random names, JSON
text valid or not, huge or absurdly nested JSON, non-JSON Python values, unicode edge cases,
unknown and foreign ids — `ToolHandlers.call` returns a `ToolResult`; an error reads
``error [<CODE>]: …`` with a code that is not ``INTERNAL`` (a bug), and changes nothing."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from controlplane import AgentHandle, ErrorCode, SubagentControl
from controlplane.tools import INTERNAL_ERROR, ToolHandlers
from tests.fakes import FakeProvider
from tests.reliability.hostile import any_value, fuzz, hostile_text, mostly, non_json, store_counts
from tests.support import PARENT_MODEL, TOOL_NAMES, WAIT_S, settle, start_child

FUZZ = fuzz(max_examples=200)


@dataclass
class Bench:
    control: SubagentControl
    tools: ToolHandlers
    parent: AgentHandle
    ids: dict[str, str]

    def state(self) -> tuple[tuple[int, int], int, int]:
        tasks = self.control.tasks
        return (
            store_counts(self.control),
            len(tasks.list(self.parent)),
            len(tasks.list("parent-2")),
        )


@pytest.fixture
def bench(control: SubagentControl, provider: FakeProvider) -> Bench:
    parent = control.agents.register("parent-1", model=PARENT_MODEL)
    stranger = control.agents.register("parent-2", model=PARENT_MODEL)
    mine = start_child(control, parent, label="mine")
    settle(control, mine.task_id, parent)
    theirs = start_child(control, stranger, label="theirs")
    settle(control, theirs.task_id, stranger)
    ids = {
        "own-child": mine.child_id,
        "own-task": mine.task_id,
        "foreign-child": theirs.child_id,
        "foreign-task": theirs.task_id,
        "unknown": "00000000-0000-4000-8000-000000000000",
    }
    return Bench(control, ToolHandlers(control, parent, provider="fake"), parent, ids)


def check(bench: Bench, name: Any, arguments: Any) -> None:
    # An earlier example's successful call may have started a Task still writing its turn.
    tasks = bench.control.tasks
    for task in tasks.list(bench.parent):
        tasks.wait(task.id, timeout=WAIT_S, requester=bench.parent)
    before = bench.state()
    result = bench.tools.call(name, arguments)
    assert isinstance(result.text, str)
    result.text.encode("utf-8")  # the harness must be able to send it to the model
    if not result.is_error:
        event(f"{name} ok")
        assert name in TOOL_NAMES
        assert not result.text.startswith("error [")
        return
    event(f"error {result.code}")
    assert result.text.startswith(f"error [{result.code}]: "), result.text
    assert result.code != INTERNAL_ERROR, result.text
    assert result.code in {code.value for code in ErrorCode}, result.text
    assert bench.state() == before, f"{result.text} changed something"


ids = st.sampled_from(["own-child", "own-task", "foreign-child", "foreign-task", "unknown"])
text_or_value = mostly(hostile_text(), any_value(), 2)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 0.001, 600, 600.0001, True]),
)


def argument_dicts() -> st.SearchStrategy[dict[str, Any]]:
    """Any of the tools' argument names, with hostile values."""
    identifier = st.one_of(ids, hostile_text(), any_value())
    known = st.fixed_dictionaries(
        {},
        optional={
            "description": text_or_value,
            "prompt": text_or_value,
            "subagent_id": identifier,
            "message": text_or_value,
            "task_id": identifier,
            "wait": st.one_of(st.booleans(), any_value()),
            "timeout_s": st.one_of(numbers, any_value()),
        },
    )
    extra = st.dictionaries(hostile_text(1), any_value(), max_size=2)
    return st.one_of(known, st.builds(lambda a, b: {**a, **b}, known, extra))


def calls_of(name: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """Calls of one tool with its own argument names (mostly) and hostile values."""
    identifier = mostly(ids, hostile_text())
    # Mostly text the tools accept, so calls get past argument checks to the control plane.
    plain = st.text(min_size=1, max_size=12).filter(str.strip)
    words = mostly(plain, hostile_text())
    fields: dict[str, st.SearchStrategy[Any]] = {
        "subagent": st.fixed_dictionaries({"description": words, "prompt": words}),
        "send_message": st.fixed_dictionaries({"subagent_id": identifier, "message": words}),
        "task_output": st.fixed_dictionaries(
            {"task_id": identifier},
            optional={"wait": st.booleans(), "timeout_s": st.sampled_from([0.01, 1, 0, -1])},
        ),
        "task_kill": st.fixed_dictionaries({"task_id": identifier}),
        "task_list": st.just({}),
        "list_agents": st.just({}),
        "set_budget": st.fixed_dictionaries(
            {"subagent_id": identifier},
            optional={limit: numbers for limit in ("tokens", "cost", "model_calls", "tool_calls")},
        ),
        "answer": st.fixed_dictionaries(
            {"request_id": identifier, "allow": mostly(st.booleans(), any_value())},
            optional={"note": words},
        ),
    }
    own = fields[name]
    return st.tuples(st.just(name), mostly(own, argument_dicts()))


tool_calls = mostly(
    st.sampled_from(TOOL_NAMES).flatmap(calls_of),
    st.one_of(
        st.tuples(st.one_of(hostile_text(), any_value()), argument_dicts()),
        st.tuples(st.sampled_from(TOOL_NAMES), st.one_of(any_value(), non_json())),
    ),
    2,
)


@FUZZ
@given(call=tool_calls, as_json=st.booleans())
@pytest.mark.slow  # measured: 30 s under load (--durations)
def test_tool_calls_with_any_name_and_arguments_answer_or_refuse_readably_and_change_nothing(
    bench: Bench, call: tuple[Any, Any], as_json: bool
) -> None:
    name, arguments = call
    arguments = resolve(bench, arguments)
    if as_json and isinstance(arguments, dict):
        # Not JSON-able (a set, NaN, a surrogate…): the dict itself is sent instead.
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            arguments = json.dumps(arguments, ensure_ascii=False)
    check(bench, name, arguments)


def resolve(bench: Bench, arguments: Any) -> Any:
    """Replace the symbolic ids a strategy drew with the bench's real ones."""
    if not isinstance(arguments, dict):
        return arguments
    return {
        key: bench.ids.get(value, value) if isinstance(value, str) else value
        for key, value in arguments.items()
    }


@FUZZ
@given(
    name=st.sampled_from(TOOL_NAMES),
    raw=st.one_of(
        hostile_text(),
        st.binary(max_size=64),
        st.sampled_from(
            [
                "",
                "{",
                "[]",
                "null",
                "NaN",
                '{"task_id": NaN}',
                '{"timeout_s": Infinity, "task_id": "x"}',
                '{"message": "\\ud800", "subagent_id": "x"}',
                '{"a": 1, "a": 2}',
                '{"description": "x", "prompt": "y"} trailing',
                "\ufeff{}",
                '{"task_id": "\\u0000"}',
            ]
        ),
    ),
)
@pytest.mark.slow  # measured: 5 s under load (--durations)
def test_tool_calls_with_arguments_that_are_not_a_json_object_are_refused_readably(
    bench: Bench, name: str, raw: Any
) -> None:
    check(bench, name, raw)


HUGE_AND_DEEP = {
    "nested arrays": "[" * 200_000 + "]" * 200_000,
    "nested objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "over the size limit": json.dumps({"description": "d", "prompt": "p" * 1_100_000}),
    "a huge prompt": json.dumps({"description": "d", "prompt": "p" * 100_001}),
    "a huge id": json.dumps({"task_id": "t" * 100_000}),
    "a long number": '{"task_id": "x", "timeout_s": ' + "9" * 5000 + "}",
}


@pytest.mark.parametrize("payload", HUGE_AND_DEEP.values(), ids=HUGE_AND_DEEP.keys())
@pytest.mark.parametrize("name", TOOL_NAMES)
def test_huge_and_absurdly_nested_arguments_are_refused_readably_and_change_nothing(
    bench: Bench, name: str, payload: str
) -> None:
    before = bench.state()
    result = bench.tools.call(name, payload)
    if name in ("task_list", "list_agents") and not result.is_error:
        return  # they take no arguments; a JSON object of junk keys must still be refused
    assert result.is_error, result.text[:300]
    assert result.text.startswith("error [INVALID_INPUT]: "), result.text[:300]
    assert len(result.text) < 2_000  # the refusal does not echo the payload back
    assert bench.state() == before


@pytest.mark.parametrize("name", TOOL_NAMES)
@pytest.mark.slow  # measured: 9 s under load (--durations)
def test_arguments_with_thousands_of_junk_keys_get_a_refusal_of_readable_size(
    bench: Bench, name: str
) -> None:
    payload = json.dumps({f"k{n}": n for n in range(50_000)})

    result = bench.tools.call(name, payload)

    assert result.text.startswith("error [INVALID_INPUT]: ")
    assert len(result.text) < 2_000, f"a {len(result.text):,}-character error result"
