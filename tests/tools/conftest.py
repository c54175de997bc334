"""Fixtures for the tool, human-input and asyncio tests: a real store, the in-process
provider driven by a `ScriptedModel`, and one parent with its `ToolHandlers`.

A module whose behaviour depends on the store overrides ``url`` with ``store_url`` to run on
SQLite and PostgreSQL; the others run on SQLite only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    InProcessProvider,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    TaskSnapshot,
)
from controlplane.tools import ToolHandlers, ToolResult
from tests.support import PARENT_MODEL, WAIT_S

PARENT = "parent-1"

STARTED = re.compile(r"started subagent (?P<child>\S+) as task (?P<task>\S+)")


@dataclass(frozen=True)
class Started:
    """The ids a `subagent` tool call reported."""

    child_id: str
    task_id: str


@dataclass(frozen=True)
class State:
    """Everything a tool call could change, as seen through the public API."""

    task_ids: tuple[str, ...]
    child_ids: tuple[str, ...]
    stored_children: tuple[str, ...]
    transcript_lengths: tuple[int, ...]
    model_calls: int


@dataclass
class Rig:
    """A control plane, its scripted model, one parent and that parent's tools."""

    control: SubagentControl
    model: ScriptedModel
    parent: AgentHandle
    tools: ToolHandlers

    def ok(self, name: str, arguments: Any) -> str:
        """Call a tool that must succeed and return its text."""
        result = self.tools.call(name, arguments)
        assert not result.is_error, result.text
        assert result.code is None
        return result.text

    def error(self, name: str, arguments: Any, code: str) -> ToolResult:
        """Call a tool that must fail with ``code``."""
        result = self.tools.call(name, arguments)
        assert result.is_error, result.text
        assert result.text.startswith(f"error [{code}]: "), result.text
        assert result.code == code
        return result

    def start(self, description: str = "research X", prompt: str = "go") -> Started:
        """Start a subagent through the tool."""
        text = self.ok("subagent", {"description": description, "prompt": prompt})
        match = STARTED.fullmatch(text)
        assert match is not None, text
        return Started(match["child"], match["task"])

    def settle(self, task_id: str) -> TaskSnapshot:
        """Wait (bounded) for one of the parent's Tasks to settle."""
        return self.control.tasks.wait(task_id, timeout=WAIT_S, requester=self.parent)

    def events(self, child_id: str) -> list[SessionEvent]:
        """The child's stored transcript."""
        assert self.control.store is not None
        return self.control.store.load(child_id).events

    def state(self) -> State:
        """A snapshot of what a tool call could change (stable while every Task is idle)."""
        assert self.control.store is not None
        children = tuple(view.child_id for view in self.control.children(self.parent))
        stored = tuple(meta.child_id for meta in self.control.store.list_children(PARENT))
        return State(
            task_ids=tuple(task.id for task in self.control.tasks.list(self.parent)),
            child_ids=children,
            stored_children=stored,
            transcript_lengths=tuple(len(self.events(child)) for child in stored),
            model_calls=self.model.call_count,
        )


MakeRig = Callable[..., Rig]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """The store the control plane opens (SQLite unless a module overrides it)."""
    return sqlite_url


@pytest.fixture
def make_rig(url: str) -> Iterator[MakeRig]:
    """Build rigs (their control planes closed after the test)."""
    made: list[SubagentControl] = []

    def make(
        replies: Sequence[Any] | None = None,
        *,
        gated: bool = False,
        session_id: str = PARENT,
        control: SubagentControl | None = None,
    ) -> Rig:
        model = ScriptedModel(replies or ["the answer"], gated=gated)
        if control is None:
            control = SubagentControl.open(url)
            made.append(control)
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register(session_id, model=PARENT_MODEL)
        return Rig(control, model, parent, ToolHandlers(control, parent))

    yield make
    for control in made:
        control.close()


@pytest.fixture
def rig(make_rig: MakeRig) -> Rig:
    """A rig whose model answers ``the answer`` at once."""
    return make_rig()


@pytest.fixture
def gated(make_rig: MakeRig) -> Rig:
    """A rig whose model calls each wait for ``rig.model.release()``."""
    return make_rig(gated=True)
