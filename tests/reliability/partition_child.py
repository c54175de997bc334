"""The partition test's runtimes: A, cut off from PostgreSQL mid-tool-call, and B, which takes
A's child over once A's lease has lapsed.

Usage:
    ``python tests/reliability/partition_child.py A URL LEASE_TTL_S LOG [TRIGGER]``
    ``python tests/reliability/partition_child.py B URL LEASE_TTL_S LOG CHILD_ID RUNTIME_ID``
    ``python tests/reliability/partition_child.py S URL LEASE_TTL_S LOG CHILD_ID SECONDS``

Every act of a child's provider is a line ``<role> <what> <monotonic time>`` in ``LOG``
(the monotonic clock is the host's, shared by every process): A's child calls its model,
then a long tool that acts (``tool-tick``) every 20 ms for up to `TOOL_S`, like a shell
command writing somewhere; B's child answers in one model call. A also writes
``A fenced <time>`` once its lease watchdog has cancelled its activations.

A prints ``READY <json>`` once its tool is acting and its turn is published, then obeys
stdin: ``wait`` prints ``WAITED <json snapshot>`` (its own `tasks.wait`), ``get`` prints
``GOT <json snapshot>`` (its own `tasks.get`), ``close`` prints
``CLOSED <seconds close took>``. B waits until A's runtime is dead in the store, then sends
A's child a message and prints ``TOOK <json>`` (route, Task, its settlement). A watchdog
ends either after `WATCHDOG_S`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    SubagentControl,
    SubagentControlError,
    TextBlock,
)
from controlplane.models import (
    ModelReply,
    ModelRequest,
    ToolCall,
)
from persistence import is_expired
from tests.support import wait_published

PARENT = "partition-parent"
_NOT_YET = (ErrorCode.OWNERSHIP_CONFLICT, ErrorCode.NOT_DELIVERED)
TOOL_S = 30.0
WATCHDOG_S = 120.0


class Acts:
    """The provider's acts, one line each in the shared log."""

    def __init__(self, role: str, path: str) -> None:
        self._role = role
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, what: str, signal: CancelSignal | None = None) -> bool:
        """Log an act about to happen; False (nothing logged) if ``signal`` aborted first.
        The time is read before the check, so a logged act began before any abort."""
        with self._lock:
            now = time.monotonic()
            if signal is not None and signal.aborted:
                return False
            os.write(self._fd, f"{self._role} {what} {now:.6f}\n".encode())
            return True


class Model:
    """A: a tool call, then (after the tool) an answer. B: an answer. A with a ``trigger``
    file: its first call waits (bounded) until the file exists, then answers, so that the
    loop's write of that answer meets the partition the test made meanwhile."""

    def __init__(self, acts: Acts, role: str, trigger: Path | None = None) -> None:
        self._acts = acts
        self._role = role
        self._trigger = trigger
        self.calling = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        if not self._acts.record("model", signal):
            raise SubagentControlError(ErrorCode.CANCELLED, f"cancelled: {signal.reason}")
        if self._trigger is not None:
            self.calling.set()
            deadline = time.monotonic() + WATCHDOG_S
            while not self._trigger.exists() and time.monotonic() < deadline:
                signal.wait(0.01)
            return ModelReply(text="answered during the partition")
        tool_results = [m for m in request.messages if m.role == "tool"]
        if self._role == "A" and not tool_results:
            return ModelReply(tool_calls=[ToolCall(id="w1", name="work", arguments="{}")])
        return ModelReply(text="done")


def work(acts: Acts, started: threading.Event) -> Any:
    def handler(_args: dict[str, Any], signal: CancelSignal) -> str:
        for _ in range(int(TOOL_S / 0.02)):
            if not acts.record("tool-tick", signal):
                return "stopped"
            started.set()
            signal.wait(0.02)
        return "finished"

    return handler


class FencedLine(logging.Handler):
    """Writes ``A fenced <time>`` when the lease watchdog logs that it fenced the runtime
    (it logs after cancelling every activation)."""

    def __init__(self, acts: Acts) -> None:
        super().__init__(logging.WARNING)
        self._acts = acts

    def emit(self, record: logging.LogRecord) -> None:
        if "lease lost" in record.getMessage():
            self._acts.record("fenced")


def run_a(url: str, lease_ttl_s: float, log: str, trigger: str | None = None) -> None:
    acts = Acts("A", log)
    logging.basicConfig(level=logging.WARNING)  # to stderr, which the test reads
    logging.getLogger("controlplane.runtime.lease._own_lease").addHandler(FencedLine(acts))
    control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s, close_timeout_s=lease_ttl_s)
    started = threading.Event()
    tool = ChildTool("work", "Act on the world.", {"type": "object"}, work(acts, started))
    model = Model(acts, "A", None if trigger is None else Path(trigger))
    if trigger is not None:
        started = model.calling
    control.providers.register(InProcessProvider(model, tools=[tool]))
    parent = control.agents.register(PARENT)
    begun = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="partitioned", parent=parent, prompt=[text("go")]
        )
    )
    assert started.wait(WATCHDOG_S)
    wait_published(control, begun.child_id)
    ready = {"child_id": begun.child_id, "task_id": begun.task_id, "runtime": control.runtime_id}
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() == "wait":
            try:
                snap = control.tasks.wait(begun.task_id, timeout=lease_ttl_s * 3, requester=parent)
                acts.record("settled")
                print("WAITED " + snap.model_dump_json(), flush=True)
            except SubagentControlError as exc:
                print(f"WAITED {json.dumps({'error': exc.code.value})}", flush=True)
        elif line.strip() == "get":
            got = control.tasks.get(begun.task_id, requester=parent)
            print("GOT " + got.model_dump_json(), flush=True)
        elif line.strip() == "close":
            began = time.monotonic()
            control.close()
            print(f"CLOSED {time.monotonic() - began:.3f}", flush=True)


def run_b(url: str, lease_ttl_s: float, log: str, child_id: str, runtime_id: str) -> None:
    acts = Acts("B", log)
    # Recovery off: B takes the child over with a message (the interrupted path the
    # partition tests check), rather than carrying A's Task on from its sweep.
    control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s, recover=False)
    control.providers.register(InProcessProvider(Model(acts, "B")))
    parent = control.agents.register(PARENT)
    store = control.store
    assert store is not None
    deadline = time.monotonic() + WATCHDOG_S
    pause = threading.Event()
    while time.monotonic() < deadline:  # until A's lease lapsed in the store
        now = store.ledger.suspects()[0]  # the clock leases are judged on
        row = store.ledger.runtime(runtime_id)
        if row is not None and is_expired(row, now):
            break
        pause.wait(0.02)
    # B judges a lapsed lease only once its own renewals have run a full lease unbroken
    # (SPEC §9 "Outages"): until then A holds the child, and the send is refused.
    while True:
        acts.record("takeover")  # the last one is the attempt that claimed the child
        try:
            sent = control.send_message(parent, child_id, [text("take over")])
            break
        except SubagentControlError as exc:
            if time.monotonic() > deadline or exc.code not in _NOT_YET:
                raise
        pause.wait(0.05)
    snap = control.tasks.wait(sent.task_id, timeout=lease_ttl_s * 3, requester=parent)
    took = {"route": sent.route, "task_id": sent.task_id, "status": snap.status.value}
    print("TOOK " + json.dumps(took), flush=True)
    control.close()


def run_s(url: str, lease_ttl_s: float, log: str, child_id: str, seconds: str) -> None:
    """A sender in another runtime (issue 36, break 1): it sends A's child a message every
    50 ms, for at most ``seconds``, until one is taken, and never sends to children of its
    own; prints ``SENT <json>`` (the route, how many were refused, the Task's end)."""
    acts = Acts("S", log)
    control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s)
    control.providers.register(InProcessProvider(Model(acts, "B")))
    parent = control.agents.register(PARENT)
    deadline = time.monotonic() + float(seconds)
    pause = threading.Event()
    refused = 0
    sent = None
    while sent is None and time.monotonic() < deadline:
        try:
            sent = control.send_message(parent, child_id, [text("from S")])
        except SubagentControlError as exc:
            if exc.code not in _NOT_YET:
                raise
            refused += 1
            pause.wait(0.05)
    result: dict[str, Any] = {"route": None, "refused": refused}
    if sent is not None:
        snap = control.tasks.wait(sent.task_id, timeout=lease_ttl_s * 3, requester=parent)
        result.update(route=sent.route, status=snap.status.value)
    print("SENT " + json.dumps(result), flush=True)
    control.close()


def text(value: str) -> TextBlock:
    return TextBlock(text=value)


def main() -> None:
    watchdog = threading.Timer(WATCHDOG_S, lambda: os._exit(3))  # the test never ended it
    watchdog.daemon = True
    watchdog.start()
    role, url, lease, log, *rest = sys.argv[1:]
    if role == "A":
        run_a(url, float(lease), log, *rest)
    elif role == "S":
        run_s(url, float(lease), log, *rest)
    else:
        run_b(url, float(lease), log, *rest)
    os._exit(0)  # A's stuck store threads (daemons) must not hold the exit


if __name__ == "__main__":
    main()
