"""The admission tests' runtime process: one `SubagentControl` with a concurrency limit on
provider ``fake``, whose runs each hold one of the limit's slot files while they act.

Usage: ``python tests/reliability/admission_child.py URL PROBE_DIR NAME LIMIT TURN_S``

A run takes a free slot file of ``PROBE_DIR`` (an exclusive non-blocking ``flock``, one
file per slot of the limit) when its provider starts and gives it back before its result
returns; finding every slot held means more than ``LIMIT`` runs act at once, in any
process, and is recorded in ``violations.log``. Commands on stdin, one answer line each:

- ``go K``: start K children, print ``queued Q`` (how many read ``queued`` at once), wait
  for them all and print ``done S1,S2,…`` (their statuses).
- ``hold``: start a child whose run acts until killed; ``holding TASK_ID`` once it acts.
- ``idle``: start a child and wait for it; ``idle CHILD_ID``.
- ``queue-start``: start a child; ``queued CHILD_ID TASK_ID STATUS``.
- ``queue-resume CHILD_ID``: send it ``adopt me``; ``queued TASK_ID STATUS``.
- ``quit``: close and print ``closed``.

A watchdog ends it after ``WATCHDOG_S`` regardless.
"""

from __future__ import annotations

import faulthandler
import fcntl
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    ResumeRequest,
    StartRequest,
    SubagentControl,
    SubagentResult,
    TextBlock,
)

PARENT = "admission-parent"
WATCHDOG_S = 120.0
LEASE_TTL_S = 3.0
WAIT_S = 60.0


class SlotProbe:
    """``limit`` slot files; a run holds one while it acts (across processes)."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.directory = directory
        self.limit = limit

    def enter(self, who: str) -> IO[bytes] | None:
        for slot in range(self.limit):
            handle = (self.directory / f"slot-{slot}.lock").open("ab")
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return handle
        fd = os.open(self.directory / "violations.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{who}: every one of {self.limit} slots held\n".encode())
        finally:
            os.close(fd)
        return None

    @staticmethod
    def exit(handle: IO[bytes] | None) -> None:
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()


class _Run:
    steer = None
    local_agent = None

    def __init__(
        self, child_id: str, probe: SlotProbe, turn_s: float | None, signal: CancelSignal
    ) -> None:
        self.child_id = child_id
        self._probe = probe
        self._turn_s = turn_s
        self._signal = signal
        self._slot = probe.enter(f"{os.getpid()}:{child_id}")

    def result(self) -> SubagentResult:
        try:
            # The turn's work: a short while, or (held) until killed.
            self._signal.wait(self._turn_s if self._turn_s is not None else WATCHDOG_S)
        finally:
            self._probe.exit(self._slot)  # before the turn ends: before its slot frees
        if self._signal.aborted:
            return SubagentResult(stop_reason="aborted", output=[])
        return SubagentResult(stop_reason="completed", output=[TextBlock(text="ok")])

    def dispose(self) -> None:
        return None


class ProbedProvider:
    """Provider ``fake``: every run holds a slot file while it acts."""

    name = "fake"

    def __init__(self, probe: SlotProbe, turn_s: float) -> None:
        self.probe = probe
        self.turn_s = turn_s
        self.hold_next = False
        self.entered = threading.Event()

    def start(self, request: StartRequest, signal: CancelSignal) -> _Run:
        return self._run(request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> _Run:
        return self._run(request, signal)

    def _run(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> _Run:
        hold, self.hold_next = self.hold_next, False
        run = _Run(request.child_id, self.probe, None if hold else self.turn_s, signal)
        if hold:
            self.entered.set()
        return run


def main(url: str, probe_dir: str, name: str, limit: int, turn_s: float) -> None:
    faulthandler.register(signal.SIGUSR1)  # a stuck run's threads, on demand, to stderr
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    control = SubagentControl.open(
        url, lease_ttl_s=LEASE_TTL_S, close_timeout_s=5.0, concurrency={"fake": limit}
    )
    provider = ProbedProvider(SlotProbe(Path(probe_dir), limit), turn_s)
    control.providers.register(provider)
    parent = control.agents.register(PARENT)

    def start(label: str) -> tuple[str, str]:
        spec = ContinuableStartSpec(
            provider="fake", label=label, prompt=[TextBlock(text=label)], parent=parent
        )
        started = control.start_continuable(spec)
        return started.child_id, started.task_id

    print(f"ready {control.runtime_id}", flush=True)
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            break
        if word == "go":
            tasks = [start(f"{name}-{i}")[1] for i in range(int(arg))]
            queued = sum(
                control.tasks.get(t, requester=parent).status.value == "queued" for t in tasks
            )
            print(f"queued {queued}", flush=True)
            done = [control.tasks.wait(t, timeout=WAIT_S, requester=parent) for t in tasks]
            print("done " + ",".join(s.status.value for s in done), flush=True)
        elif word == "hold":
            provider.hold_next = True
            _child, task_id = start(f"{name}-held")
            provider.entered.wait(WAIT_S)
            print(f"holding {task_id}", flush=True)
        elif word == "idle":
            child_id, task_id = start(f"{name}-idle")
            control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
            print(f"idle {child_id}", flush=True)
        elif word == "queue-start":
            child_id, task_id = start(f"{name}-queued")
            status = control.tasks.get(task_id, requester=parent).status.value
            print(f"queued {child_id} {task_id} {status}", flush=True)
        elif word == "queue-resume":
            sent = control.send_message(parent, arg, [TextBlock(text="adopt me")])
            # `started` is answered before the resumed turn's frame is written (its load
            # comes first): the test kills this runtime once the message is durable.
            _until_written(control, arg, "adopt me")
            status = control.tasks.get(sent.task_id, requester=parent).status.value
            print(f"queued {sent.task_id} {status}", flush=True)
    control.close()
    print("closed", flush=True)


def _until_written(control: SubagentControl, child_id: str, text: str) -> None:
    """Wait (bounded) until ``text`` is a ``user/message`` of the child's transcript."""
    assert control.store is not None
    deadline = time.monotonic() + WATCHDOG_S
    while time.monotonic() < deadline:
        events = control.store.load(child_id).events
        if any(e.kind == "user/message" and e.data.get("text") == text for e in events):
            return
        time.sleep(0.005)
    raise SystemExit(f"the message {text!r} was never written")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
