"""The budget gate reads the spend counters once per turn, not before every call: the
turn's first check uses the resume's own read; after that, each append that records a
call's spend returns its scopes' rows, and the next check uses them. What a check sees is
never older than the end of the run's previous call, so the overshoot stays one call per
running activation, whoever spent (another runtime included).

SQLite in ``tmp_path`` (the statements are traced on the store's connections); the
ledger-level tests run on PostgreSQL too when its URL is set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    Budget,
    ChildMeta,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    NewEvent,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.contract import MODEL_CALL, Spent, usage_data
from controlplane.models import ModelReply, ToolCall
from controlplane.runtime.spend._budgets import Budgets
from persistence import SqlStore
from tests.support import SqliteStatements

WAIT_S = 10.0
CALLS = 10
LOOK = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])
SPEND_60 = Usage(input_tokens=50, output_tokens=10)


class SpendReads(SqliteStatements):
    """Counts the statements that read the spend counters outside a write transaction."""

    def counts(self, statements: Sequence[str], *, transaction: bool) -> bool:
        return not transaction and "subagent_spend " in statements[0] + " "


class Looks:
    """A ``look`` tool whose calls wait while the test holds them back."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.tool = ChildTool("look", "Look around.", {"type": "object"}, self._run)

    def _run(self, _arguments: dict[str, Any]) -> str:
        if not self.release.wait(WAIT_S):
            raise TimeoutError("the test never released the tool")
        return "seen"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[SubagentControl, SpendReads, Looks]]:
    with SpendReads() as counted:
        script: list[str | ModelReply] = ([LOOK] * (CALLS - 1) + ["done"]) * 3
        control = SubagentControl.open(
            f"sqlite:///{tmp_path / 'reads.db'}", session_budget=Budget(tokens=10**9)
        )
        try:
            looks = Looks()
            model = ScriptedModel(script, usage=SPEND_60)
            control.providers.register(InProcessProvider(model, tools=[looks.tool]))
            yield control, counted, looks
        finally:
            control.close(timeout_s=10.0)


def test_a_turn_of_many_calls_reads_the_counters_once_not_before_every_call(
    plane: tuple[SubagentControl, SpendReads, Looks],
) -> None:
    control, counted, looks = plane
    parent = control.agents.register("parent-1")
    looks.release.set()
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="calls", prompt=[TextBlock(text="go")],
            parent=parent, budget=Budget(tokens=10**9, model_calls=10**6),
        )
    )  # fmt: skip
    first = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    assert first.status is TaskStatus.COMPLETED, first
    looks.release.clear()

    before = counted.count
    sent = control.send_message(parent, started.child_id, [TextBlock(text="again")], None)
    # A steer is answered once the turn is published: until then its calls' usage is
    # held in this process, not written, and each check reads the counters.
    steered = control.send_message(parent, started.child_id, [TextBlock(text="more")], None)
    assert steered.route == "steered"
    looks.release.set()
    done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)

    assert done.status is TaskStatus.COMPLETED, done
    assert done.usage.model_calls == CALLS
    assert done.usage.tool_calls == CALLS - 1
    # 10 model calls and 9 tool calls checked: the resume's refusal check reads the
    # counters and the turn's first check uses that read; the first tool call's check
    # may come before the turn is published and read them; no check after that reads.
    assert counted.count - before <= 2, counted.count - before


# -- the bound, at the ledger ------------------------------------------------------------------


def _spend(store: SqlStore, child_id: str, turn: int, tokens: int) -> None:
    usage = Usage(input_tokens=tokens, output_tokens=0)
    data = {"text": "reply", **usage_data(usage, counted=Usage(model_calls=1))}
    store.append(child_id, [NewEvent(kind="assistant/message", turn=turn, data=data)])


def _budgets(store: SqlStore) -> Budgets:
    return Budgets(
        store.spend, session_budget=Budget(tokens=100), tree_budget=None, notice_at=None,
        max_tool_rounds=None,
    )  # fmt: skip


@dataclass(frozen=True)
class _View:
    """The activation view a gate reads (`controlplane.contract.ActivationFacts`)."""

    child_id: str
    task_id: str = "t1"
    owner_session: str = "session-1"
    fence: int | None = None
    phase: str = "published"


def _gate(budgets: Budgets, child_id: str) -> Any:
    return budgets.gate(_View(child_id), label="l", own=None, held=Spent)


def test_another_runtimes_spend_stops_a_run_after_at_most_one_more_call(store_url: str) -> None:
    with SqlStore(store_url) as mine, SqlStore(store_url) as theirs:
        for child_id in ("me", "sibling"):
            mine.create_child(ChildMeta(child_id=child_id, parent_session="session-1", depth=1))
        gate = _gate(_budgets(mine), "me")

        gate.check(MODEL_CALL)  # the turn's first check reads: 0 of 100 spent
        _spend(mine, "me", 1, 40)  # its append returns the session's row: 40
        # Another runtime's sibling spends the session past its limit after that append.
        _spend(theirs, "sibling", 1, 70)
        # The check sees the rows as this run's previous call left them (40): this call
        # started within the limit as far as the run could know, the one call of
        # overshoot; its append brings the other runtime's spend back with it.
        gate.check(MODEL_CALL)
        _spend(mine, "me", 1, 40)

        with pytest.raises(SubagentControlError) as raised:
            gate.check(MODEL_CALL)
        assert raised.value.code is ErrorCode.BUDGET_EXHAUSTED
        assert "token budget of 100 spent: 150" in raised.value.message


def test_a_check_with_no_append_since_the_last_call_reads_again(store_url: str) -> None:
    with SqlStore(store_url) as mine, SqlStore(store_url) as theirs:
        for child_id in ("me", "sibling"):
            mine.create_child(ChildMeta(child_id=child_id, parent_session="session-1", depth=1))
        gate = _gate(_budgets(mine), "me")

        gate.check(MODEL_CALL)
        _spend(theirs, "sibling", 1, 100)  # the limit, reached elsewhere
        # The call checked above wrote nothing (it failed, say): the next check has no
        # newer rows from this run and reads them.
        with pytest.raises(SubagentControlError) as raised:
            gate.check(MODEL_CALL)
        assert raised.value.code is ErrorCode.BUDGET_EXHAUSTED


def test_rows_an_earlier_turn_left_never_stand_in_for_a_newer_read(store_url: str) -> None:
    with SqlStore(store_url) as mine, SqlStore(store_url) as theirs:
        for child_id in ("me", "sibling"):
            mine.create_child(ChildMeta(child_id=child_id, parent_session="session-1", depth=1))
        budgets = _budgets(mine)
        _spend(mine, "me", 1, 40)  # an earlier turn's last append: 40 spent then
        gate = _gate(budgets, "me")  # the next turn's

        gate.check(MODEL_CALL)  # its first check reads: 40
        _spend(theirs, "sibling", 2, 60)  # the limit, reached elsewhere
        # Nothing newer from this run since that read: the earlier turn's rows (40) are
        # older than it, so the check reads again.
        with pytest.raises(SubagentControlError) as raised:
            gate.check(MODEL_CALL)
        assert "token budget of 100 spent: 100" in raised.value.message


def test_a_resumed_turn_checks_its_first_call_against_the_resumes_own_read(
    tmp_path: Path,
) -> None:
    with SpendReads() as counted:
        control = SubagentControl.open(f"sqlite:///{tmp_path / 'one.db'}")
        try:
            model = ScriptedModel(["one", "two"], usage=SPEND_60)
            control.providers.register(InProcessProvider(model))
            parent = control.agents.register("parent-1")
            started = control.start_continuable(
                ContinuableStartSpec(
                    provider="inprocess", label="one", prompt=[TextBlock(text="go")],
                    parent=parent, budget=Budget(tokens=10**9),
                )
            )  # fmt: skip
            control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
            before = counted.count
            sent = control.send_message(parent, started.child_id, [TextBlock(text="on")], None)
            done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        finally:
            control.close(timeout_s=10.0)

    assert done.status is TaskStatus.COMPLETED, done
    assert done.usage.model_calls == 1
    # The resume's refusal check reads the counters; its turn's one model call is
    # checked against that read.
    assert counted.count - before == 1


def test_only_the_gates_store_calls_run_inside_the_activations_fence(store_url: str) -> None:
    with SqlStore(store_url) as store:
        store.create_child(ChildMeta(child_id="me", parent_session="session-1", depth=1))
        wrapped: list[str] = []

        def fenced(call: Any) -> Any:
            wrapped.append("store call")
            return call()

        gate = _budgets(store).gate(_View("me"), label="l", own=None, held=Spent, fenced=fenced)
        gate.check(MODEL_CALL)  # the turn's first check reads the counters
        assert wrapped == ["store call"]
        _spend(store, "me", 1, 40)  # its append leaves the rows for the next check
        gate.check(MODEL_CALL)
        assert wrapped == ["store call"]  # answered from them: no store call, no fence
        gate.check(MODEL_CALL)  # nothing newer from this run since: it reads again
        assert wrapped == ["store call", "store call"]
