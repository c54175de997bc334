"""Small helpers the reliability tests share (public API only)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TextBlock,
)

SUMMARY_ENV = "SUBAGENT_CONTROL_RELIABILITY_SUMMARY"
"""Set to a file path to collect the figures of the stress and crash tests as JSON."""

WAIT_S = 10.0
"""How long a test waits for something that should happen promptly."""


def text(*parts: str) -> list[TextBlock]:
    """Content blocks from strings."""
    return [TextBlock(text=part) for part in parts]


def start_child(
    control: SubagentControl,
    parent: AgentHandle,
    *,
    provider: str = "fake",
    label: str = "research X",
    prompt: str = "go",
    **fields: Any,
) -> ContinuableStart:
    """Start a continuable child with a one-block prompt."""
    spec = ContinuableStartSpec(
        provider=provider, label=label, prompt=text(prompt), parent=parent, **fields
    )
    return control.start_continuable(spec)


def settle(control: SubagentControl, task_id: str, requester: AgentHandle | str) -> TaskSnapshot:
    """Wait (bounded) until a Task is terminal and its activation gone."""
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=requester)
    assert snapshot.status.is_terminal, snapshot
    return snapshot


def events(control: SubagentControl, child_id: str) -> list[SessionEvent]:
    """The child's stored transcript."""
    assert control.store is not None
    return control.store.load(child_id).events


def kinds(stored: Sequence[SessionEvent]) -> list[str]:
    """The kinds of ``stored``, in order."""
    return [event.kind for event in stored]


def carrying(stored: Sequence[SessionEvent], needle: str) -> list[SessionEvent]:
    """The events whose JSON data mention ``needle``."""
    return [e for e in stored if needle in json.dumps(e.data, ensure_ascii=False)]


def inbound(stored: Sequence[SessionEvent], message: str) -> list[SessionEvent]:
    """The ``user/message`` and ``steering/message`` events whose text is ``message``."""
    return [
        e
        for e in stored
        if e.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
        and isinstance(e.data, dict)
        and e.data.get("text") == message
    ]


def is_durable(control: SubagentControl, child_id: str) -> bool:
    """Whether the store has the child (a header) at all."""
    assert control.store is not None
    try:
        control.store.load(child_id)
    except SubagentControlError:
        return False
    return True


def eventually(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Wait until ``predicate()`` holds, for state the public API exposes no event for."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        pause.wait(0.002)


def count_events(control: SubagentControl, parents: Sequence[str]) -> int:
    """How many events the store holds for every child of ``parents``."""
    assert control.store is not None
    total = 0
    for session in parents:
        for meta in control.store.list_children(session):
            total += len(control.store.load(meta.child_id).events)
    return total


@contextmanager
def raises(code: ErrorCode, *, match: str | None = None) -> Iterator[Any]:
    """Expect a `SubagentControlError` with ``code`` (and ``match`` in its message)."""
    with pytest.raises(SubagentControlError) as info:
        yield info
    assert info.value.code == code, f"expected {code}, got {info.value!r}"
    if match is not None:
        assert match in info.value.message, f"{match!r} not in {info.value.message!r}"


def write_summary(section: str, backend: str, figures: dict[str, Any]) -> None:
    """Print a test's figures and merge them into the summary file, if one is asked for."""
    print(json.dumps({section: {backend: figures}}, indent=2, sort_keys=True))
    path = os.environ.get(SUMMARY_ENV)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as existing:
            merged = json.load(existing)
    except (FileNotFoundError, json.JSONDecodeError):
        merged = {}
    merged.setdefault(section, {})[backend] = figures
    with open(path, "w", encoding="utf-8") as out:
        json.dump(merged, out, indent=2, sort_keys=True)
