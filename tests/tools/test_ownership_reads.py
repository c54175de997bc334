"""What `send_message`'s ownership check reads, counted (SQLite's statement trace, the
benchmarks' counters): one point read of the child's header the first time, nothing after,
however many children and Tasks the parent has. Not timed: the time is the benchmarks'
(the Protocol fronts section's tools steer against the session's size)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._counting import Counts, counting
from benchmarks._harness import sqlite_url
from controlplane import SubagentControl
from controlplane.tools import ToolHandlers
from tests.fakes import FakeProvider
from tests.support import PARENT_MODEL, running_child, settle, start_child, text

HEADER_READ = Counter({"read: children": 1})


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """The gate every running child's turn waits on, opened after the test."""
    gate = threading.Event()
    yield gate
    gate.set()


def _steer_counts(tmp_path: Path, gate: threading.Event, *, children: int) -> list[Counts]:
    """The counts of an API steer, then of three tool steers to one child, with
    ``children`` running children and as many settled Tasks in the parent's session."""
    with counting() as counts:  # the connections must be opened inside
        control = SubagentControl.open(sqlite_url(tmp_path / f"reads-{children}.db"))
        try:
            provider = FakeProvider()
            control.providers.register(provider)
            parent = control.agents.register("parent-1", model=PARENT_MODEL)
            for _ in range(children):  # settled Tasks grow the session too
                settle(control, start_child(control, parent).task_id, parent)
            pool = [running_child(control, parent, provider, gate)[0] for _ in range(children)]
            tools = ToolHandlers(control, parent, provider=provider.name)
            steers: list[Counts] = []
            before = counts.snapshot()
            control.send_message(parent, pool[0], text("via the API"))
            steers.append(counts.since(before))
            for n in range(3):
                before = counts.snapshot()
                result = tools.call("send_message", {"subagent_id": pool[-1], "message": f"{n}"})
                assert result.text.startswith("message delivered"), result.text
                steers.append(counts.since(before))
        finally:
            control.close()
    return steers


def _sent(counts: Counts) -> Counter[str]:
    """The transactions of the send itself: the runtime's housekeeping threads (its lease
    renewals, dead-runtime reads, wake-up polls) may land inside the window, by the
    scheduler's whim."""
    return counts.transactions - counts.swept


def _sent_statements(counts: Counts) -> int:
    return counts.statements - counts.swept_statements


@pytest.mark.parametrize("children", [1, 12])
def test_a_tool_steer_reads_the_childs_header_once_then_costs_what_the_api_steer_does(
    tmp_path: Path, released: threading.Event, children: int
) -> None:
    api, first, second, third = _steer_counts(tmp_path, released, children=children)

    assert _sent(first) == _sent(api) + HEADER_READ
    assert _sent(second) == _sent(api)
    assert _sent(third) == _sent(api)
    assert first.messages == second.messages == api.messages  # the same actor hops


def test_a_tool_steers_reads_do_not_grow_with_the_parents_children_and_tasks(
    tmp_path: Path, released: threading.Event
) -> None:
    few = _steer_counts(tmp_path, released, children=1)
    many = _steer_counts(tmp_path, released, children=12)

    for small, large in zip(few, many, strict=True):
        assert _sent(small) == _sent(large)
        assert _sent_statements(small) == _sent_statements(large)
