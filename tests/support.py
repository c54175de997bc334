"""Small helpers the test suites share (public API only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    ModelSelector,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    SubagentProvider,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from persistence import SqlStore
from tests.fakes import FakeProvider, Plan

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
"""The repository root."""

Running = tuple[str, str, Plan]
"""What `running_child` returns: the child's id, its Task's id and its provider plan."""

MakeControl = Callable[..., SubagentControl]
"""The ``make_control`` fixture: opens a control plane with the fake provider registered."""

PARENT_MODEL = ModelSelector(provider="acme", model="m1")
"""The model selector of the ``parent`` and ``stranger`` fixtures."""

TOOL_NAMES = [
    "subagent",
    "send_message",
    "task_output",
    "task_kill",
    "task_list",
    "list_agents",
    "set_budget",
    "answer",
]
"""The parent's tools, in the order `ToolHandlers.definitions()` gives them (SPEC §7, and
``set_budget`` and ``answer`` from §11)."""

WAIT_S = 10.0
"""How long a test waits for something that should happen promptly."""

FRAME_KINDS = frozenset({EventKind.TURN_START, EventKind.TURN_END})


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
    """Wait (bounded) until a Task is terminal."""
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=requester)
    assert snapshot.status.is_terminal, snapshot
    return snapshot


def idle_child(control: SubagentControl, parent: AgentHandle) -> str:
    """A child of ``parent`` whose first turn has settled."""
    started = start_child(control, parent)
    settle(control, started.task_id, parent)
    return started.child_id


def starting_child(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    gate: threading.Event | None = None,
    **script: Any,
) -> tuple[ContinuableStart, Plan]:
    """A child whose provider call has begun and waits for ``gate``.

    Returns the start and the provider plan (``script`` adds to it). Without ``gate`` the
    call waits on one the test never opens: only a kill or ``close`` ends it.
    """
    plan = provider.plan(start_gate=threading.Event() if gate is None else gate, **script)
    started = start_child(control, parent)
    assert plan.entered.wait(WAIT_S)
    return started, plan


def running_child(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    gate: threading.Event,
    *,
    label: str = "research X",
    **script: Any,
) -> Running:
    """A child whose run is published and whose turn waits for ``gate``.

    ``script`` adds to the provider plan.
    """
    plan = provider.plan(result_gate=gate, **script)
    started = start_child(control, parent, label=label)
    assert plan.returned.wait(WAIT_S)
    wait_published(control, started.child_id)
    return started.child_id, started.task_id, plan


def failed_outcome(snapshot: TaskSnapshot) -> TaskOutcome:
    """The outcome of a Task that must have failed."""
    assert snapshot.status is TaskStatus.FAILED, snapshot
    assert snapshot.outcome is not None
    return snapshot.outcome


# -- the stored transcript -------------------------------------------------------------------


def events(control: SubagentControl, child_id: str) -> list[SessionEvent]:
    """The child's stored transcript."""
    assert control.store is not None
    return control.store.load(child_id).events


def kinds(stored: Sequence[SessionEvent]) -> list[str]:
    """The kinds of ``stored``, in order."""
    return [event.kind for event in stored]


def mentions(event: SessionEvent, needle: str) -> bool:
    """Whether an event's JSON data contains ``needle``."""
    return needle in json.dumps(event.data, ensure_ascii=False)


def mentioning(stored: Sequence[SessionEvent], needle: str) -> list[SessionEvent]:
    """Every event, the turn frame included, whose JSON data mentions ``needle``."""
    return [e for e in stored if mentions(e, needle)]


def carrying(stored: Sequence[SessionEvent], needle: str) -> list[SessionEvent]:
    """The events, other than the turn frame (which may repeat a label), mentioning ``needle``."""
    return [e for e in stored if e.kind not in FRAME_KINDS and mentions(e, needle)]


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


# -- errors, threads and waiting ---------------------------------------------------------------


@contextmanager
def raises(code: ErrorCode, *, match: str | None = None) -> Iterator[Any]:
    """Expect a `SubagentControlError` with ``code`` (and ``match`` in its message)."""
    with pytest.raises(SubagentControlError) as info:
        yield info
    assert info.value.code == code, f"expected {code}, got {info.value!r}"
    if match is not None:
        assert match in info.value.message, f"{match!r} not in {info.value.message!r}"


def in_thread(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` in a fresh thread; its result or exception lands in the future."""
    future: Future[T] = Future()

    def body() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=body, daemon=True).start()
    return future


def eventually(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Wait until ``predicate()`` holds, for state the public API exposes no event for."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        pause.wait(0.001)


def run_python(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in a fresh interpreter from the repository root, which it imports
    from, with ``env`` added to this one's environment; its output is captured as text."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- the supervision tree ----------------------------------------------------------------------


def held_messages(control: SubagentControl, child_id: str) -> int:
    """How many messages the child's supervisor holds for publication (from the tree dump)."""
    tree = control.dump_tree(timeout_s=1.0)
    return sum(s.held_messages for s in tree.supervisors if s.child_id == child_id)


def is_published(control: SubagentControl, child_id: str) -> bool:
    """Whether the child's current activation has published its run (from the tree dump)."""
    for node in control.dump_tree(timeout_s=1.0).supervisors:
        if node.child_id == child_id and node.activation is not None:
            return node.activation.published
    return False


def wait_published(control: SubagentControl, child_id: str) -> None:
    """Wait until the child's current activation has published its run."""
    eventually(lambda: is_published(control, child_id), f"child {child_id} is published")


def supervised(control: SubagentControl) -> set[str]:
    """The child ids that have a supervisor (an association) right now."""
    return {s.child_id for s in control.dump_tree(timeout_s=1.0).supervisors}


def task_ids(control: SubagentControl, requester: AgentHandle | str) -> list[str]:
    """The requester's Task ids, oldest first."""
    return [snapshot.id for snapshot in control.tasks.list(requester)]


@runtime_checkable
class Gated(Protocol):
    """A test store whose armed call waits on ``gate`` until the test opens it."""

    gate: threading.Event


@contextmanager
def gated_control(
    store: SqlStore, provider: SubagentProvider, **options: Any
) -> Iterator[SubagentControl]:
    """A control plane on ``store`` (a `Gated` one) with ``provider`` registered; on the way
    out the gate is opened, so a call still held there ends, and the plane is closed."""
    assert isinstance(store, Gated)
    control = SubagentControl(store, **options)
    control.providers.register(provider)
    try:
        yield control
    finally:
        store.gate.set()
        control.close(timeout_s=10.0)


class SqliteStatements:
    """Counts, on every SQLite connection opened while it listens (a ``with`` block), the
    units of work a subclass's `counts` picks, from whichever thread runs them: a
    transaction that committed, or a statement run outside any transaction."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def counts(self, statements: Sequence[str], *, transaction: bool) -> bool:
        """Whether one unit counts: a committed transaction's statements between its
        ``BEGIN`` and ``COMMIT`` (``transaction``), or one statement outside any."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        from sqlalchemy import event
        from sqlalchemy.pool import Pool

        event.listen(Pool, "connect", self._traced)
        return self

    def __exit__(self, *_exc: object) -> None:
        from sqlalchemy import event
        from sqlalchemy.pool import Pool

        event.remove(Pool, "connect", self._traced)

    def _traced(self, connection: Any, _record: Any) -> None:
        import sqlite3

        if not isinstance(connection, sqlite3.Connection):
            return
        open_transaction: list[str] | None = None  # this connection's, while one is open

        def trace(statement: str) -> None:
            nonlocal open_transaction
            head = statement.lstrip()[:12].upper()
            if head.startswith("BEGIN"):
                open_transaction = []
            elif head.startswith("ROLLBACK"):
                open_transaction = None
            elif head.startswith("COMMIT"):
                done, open_transaction = open_transaction, None
                if done is not None and self.counts(done, transaction=True):
                    self._add()
            elif open_transaction is not None:
                open_transaction.append(statement)
            elif self.counts([statement], transaction=False):
                self._add()

        connection.set_trace_callback(trace)

    def _add(self) -> None:
        with self._lock:
            self.count += 1
