"""Fixtures for the reliability tests: a control plane on a real store, a fake provider, parents.

A module that must run on both backends overrides ``url`` with ``store_url``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controlplane import AgentHandle, ModelSelector, SubagentControl
from tests.fakes import FakeProvider

PARENT_MODEL = ModelSelector(provider="acme", model="m1")

MakeControl = Callable[..., SubagentControl]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """The store the control plane opens (SQLite unless a module overrides it)."""
    return sqlite_url


@pytest.fixture
def provider() -> FakeProvider:
    """The fake provider, registered as ``fake`` on every control plane a test makes."""
    return FakeProvider()


@pytest.fixture
def make_control(url: str, provider: FakeProvider) -> Iterator[MakeControl]:
    """Build control planes on ``url`` (closed after the test) with ``provider`` registered."""
    made: list[SubagentControl] = []

    def make(store_url: str | None = None, **options: Any) -> SubagentControl:
        control = SubagentControl.open(store_url or url, **options)
        control.providers.register(provider)
        made.append(control)
        return control

    yield make
    for control in made:
        control.close(timeout_s=10.0)


@pytest.fixture
def control(make_control: MakeControl) -> SubagentControl:
    """A control plane on the test's store."""
    return make_control()


@pytest.fixture
def parent(control: SubagentControl) -> AgentHandle:
    """The live parent that owns the children a test starts."""
    return control.agents.register("parent-1", model=PARENT_MODEL)


@pytest.fixture
def stranger(control: SubagentControl) -> AgentHandle:
    """Another live parent session: it must never reach ``parent``'s children or Tasks."""
    return control.agents.register("parent-2", model=PARENT_MODEL)
