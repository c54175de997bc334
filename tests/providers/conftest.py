"""Provider tests: every launched run is disposed, and no agent-loop thread outlives a test."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from controlplane.providers._agent_loop import THREAD_PREFIX

from .fakes import Runs


def loop_threads() -> list[threading.Thread]:
    """The agent-loop threads alive right now."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(autouse=True)
def _no_loop_thread_left() -> Iterator[None]:
    assert loop_threads() == [], "an earlier test leaked an agent-loop thread"
    yield
    # Checked without joining: dispose() must already have joined every loop thread.
    assert loop_threads() == [], "a test left an agent-loop thread running"


@pytest.fixture
def runs() -> Iterator[Runs]:
    launched = Runs()
    yield launched
    launched.dispose_all()
