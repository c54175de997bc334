"""A runtime whose child's turn is caught mid-way, for `test_recovery.py`: it starts a child
(or resumes one it completed first) whose turn stops at a chosen point, prints
``READY {json}`` there and waits to be SIGKILLed (bounded: it exits by itself after a
minute), or, for ``suicide``, kills itself from inside the model call.

Args: store URL, mode, the file the ``work`` tool appends a line to each time it runs,
and optionally ``close_timeout_s`` and ``lease_ttl_s`` (both 30 by default).

Modes:
- ``model``: the first model call never returns;
- ``tool``: the model calls ``work`` (not idempotent), which never returns;
- ``idempotent``: the same with ``work`` declared idempotent;
- ``resumed``: turn 1 completes, then a message resumes the child (``started``), and that
  turn's model call never returns;
- ``steered``: the model call never returns, and a steer is answered ``steered`` first;
- ``acked``: turn 1 completes, then a message resumes the child (``started``) and the
  runtime stops right there: its activation's load of the child is held, so nothing of the
  turn but what was written before ``started`` is in the store;
- ``suicide``: every model call SIGKILLs its own process (a child that keeps killing its
  runtime);
- ``recoverer``: starts nothing; registers the ``suicide`` model, so the Task it takes
  over kills it again; exits (printing ``SETTLED``) once every Task of the parent ended;
- ``worker``: starts nothing; registers a model that answers ``done by the worker`` (and
  appends the user texts each of its calls saw to the runs file, a JSON list a line), so
  it runs the Task a runtime without the provider left for it; exits (printing
  ``SETTLED``) once every Task of the parent ended;
- ``close``: like ``model``, but the runtime then closes (handing the turn over) with the
  ``close_timeout_s`` given as a fourth argument, and prints ``CLOSED``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import LoadedSession
from controlplane.models import ModelReply, ModelRequest, ToolCall
from persistence import SqlStore

LIFETIME_S = 60.0
PARENT = "recovery-parent"


def work_tool(runs: Path, *, idempotent: bool = False, hang: threading.Event | None = None
              ) -> ChildTool:  # fmt: skip
    """The ``work`` tool: logs each run; with ``hang``, sets it and never returns."""

    def run(arguments: dict[str, str]) -> str:
        with runs.open("a", encoding="utf-8") as log:
            log.write(json.dumps(arguments) + "\n")
        if hang is not None:
            hang.set()
            threading.Event().wait(LIFETIME_S)
        return f"worked on {arguments.get('item')}"

    return ChildTool("work", "Work on an item.", {"type": "object"}, run, idempotent=idempotent)


class StuckModel:
    """A model whose calls follow a script, and whose call number ``stuck_at`` (from 0)
    sets ``entered`` and never returns (``suicide``: SIGKILLs its process instead)."""

    def __init__(self, replies: list[str | ModelReply], stuck_at: int | None,
                 *, suicide: bool = False, seen: Path | None = None) -> None:  # fmt: skip
        self._replies = replies
        self._seen = seen
        self._stuck_at = stuck_at
        self._suicide = suicide
        self._calls = 0
        self._lock = threading.Lock()
        self.entered = threading.Event()
        self.before_kill: Callable[[], None] | None = None

    def complete(self, request: ModelRequest, signal_: CancelSignal) -> ModelReply:
        if self._seen is not None:  # the user texts each call saw, one JSON line per call
            with self._seen.open("a", encoding="utf-8") as log:
                users = [m.text for m in request.messages if m.role == "user"]
                log.write(json.dumps(users) + "\n")
        with self._lock:
            n = self._calls
            self._calls += 1
        if self._suicide:
            if self.before_kill is not None:
                self.before_kill()
            os.kill(os.getpid(), signal.SIGKILL)
        if n == self._stuck_at:
            self.entered.set()
            signal_.wait(LIFETIME_S)  # stopped by a close (a SIGKILL stops it anyway)
            signal_.raise_if_aborted()
        reply = self._replies[min(n, len(self._replies) - 1)]
        return reply if isinstance(reply, ModelReply) else ModelReply(text=reply)


def _published(control: SubagentControl) -> None:
    """Return once the parent's child is in the store: the first model call may begin
    before the child's publication commits, and a start killed before that leaves nothing
    to recover (SPEC §5)."""
    assert control.store is not None
    deadline = time.monotonic() + LIFETIME_S
    while not control.store.list_children(PARENT):
        if time.monotonic() > deadline:
            raise SystemExit("the child was never published")
        time.sleep(0.01)


class HeldLoads(SqlStore):
    """A store whose loads, once held, never return (the process is killed meanwhile)."""

    hold = False
    waiting = threading.Event()

    def load(self, child_id: str) -> LoadedSession:
        if self.hold:
            self.waiting.set()
            threading.Event().wait(LIFETIME_S)
        return super().load(child_id)


WORK = ModelReply(tool_calls=[ToolCall(id="w1", name="work", arguments={"item": "a"})])


def main(url: str, mode: str, runs: str, close_timeout_s: str = "30", lease_s: str = "30") -> None:
    hang = threading.Event()
    if mode in ("tool", "idempotent"):
        model = StuckModel([WORK], stuck_at=None)
        tools = [work_tool(Path(runs), idempotent=mode == "idempotent", hang=hang)]
        entered = hang
    elif mode == "resumed":
        model = StuckModel(["first turn done"], stuck_at=1)
        tools, entered = [], model.entered
    elif mode == "acked":
        model = StuckModel(["first turn done"], stuck_at=None)
        tools, entered = [], HeldLoads.waiting
    elif mode == "close":
        model = StuckModel(["never"], stuck_at=0)
        tools, entered = [], model.entered
    else:
        model = StuckModel(["never"], stuck_at=0, suicide=mode == "suicide")
        tools, entered = [], model.entered
    store = HeldLoads(url)
    control = SubagentControl(
        store, lease_ttl_s=float(lease_s), close_timeout_s=float(close_timeout_s)
    )
    parent = control.agents.register(PARENT)
    if mode in ("recoverer", "worker"):
        # recoverer: takes the dead runtime's Task over, and dies in its model call;
        # worker: runs the Task a runtime without the provider left for it.
        suicide = mode == "recoverer"
        replies: list[str | ModelReply] = ["x" if suicide else "done by the worker"]
        seen = None if suicide else Path(runs)
        model = StuckModel(replies, None, suicide=suicide, seen=seen)
        control.providers.register(InProcessProvider(model))
        deadline = time.monotonic() + LIFETIME_S
        while any(not t.status.is_terminal for t in control.tasks.list(requester=parent)):
            if time.monotonic() > deadline:
                raise SystemExit("the task neither ended nor was taken over")
            time.sleep(0.05)
        control.close()
        print("SETTLED", flush=True)
        return
    if mode == "suicide":  # killed once the child is durable: a recovery has it to go on
        model.before_kill = lambda: _published(control)
    control.providers.register(InProcessProvider(model, tools=tools))
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label=mode, prompt=[TextBlock(text="do it")], parent=parent
        )
    )
    task_id = started.task_id
    acked: list[str] = []
    if mode in ("resumed", "acked"):
        done = control.tasks.wait(task_id, timeout=LIFETIME_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        store.hold = mode == "acked"
        result = control.send_message(parent, started.child_id, [TextBlock(text="go on")])
        assert result.route == "started", result
        task_id = result.task_id
        acked.append("go on")
    if not entered.wait(LIFETIME_S):
        raise SystemExit("the turn never reached the point to stop at")
    _published(control)
    if mode == "steered":
        result = control.send_message(parent, started.child_id, [TextBlock(text="also this")])
        assert result.route == "steered", result
        acked.append("also this")
    ready = {"task_id": task_id, "child_id": started.child_id, "acked": acked,
             "runtime_id": control.runtime_id}  # fmt: skip
    print("READY " + json.dumps(ready), flush=True)
    if mode == "close":
        sys.stdin.readline()  # the test's other runtime is up
        began = time.monotonic()
        control.close()
        print(f"CLOSED {time.monotonic() - began:.3f}", flush=True)
        return
    threading.Event().wait(LIFETIME_S)


if __name__ == "__main__":
    main(*sys.argv[1:6])
