"""The cross-process stress test's worker: one runtime running the stress load on a shared store.

Usage: ``python tests/reliability/stress_child.py URL NAME CHILD_ID,... SENDS_PER_THREAD LOCKS OUT``

It opens its own runtime on ``URL``, registers the shared parent session and prints
``ready <runtime_id>``. On ``go`` (stdin) it runs the single-process stress load (`load.py`:
twelve sender threads, kills mixed in) against the given children, every message text
prefixed with ``NAME`` so it is unique across processes, then lets its own activations finish
(the clock drains) and prints ``sent``. It stays open, serving the messages and kills other
processes forward here, until ``close``: then it waits for its own Tasks, closes, writes what
every call was told to ``OUT`` as JSON lines (a ``message`` record per send, one ``figures``
record) and prints ``closed``. A watchdog ends it after ``WATCHDOG_S`` regardless.

The provider is the stress test's `SteppingProvider`, which also holds an exclusive
``flock`` on ``LOCKS/<child_id>.lock`` (a directory all processes share) from entering
``start``/``resume`` to the end of ``dispose``: a second activation of the same child, in this
process or any other, finds the lock taken, and is counted in ``overlaps``.

With ``SUBAGENT_CONTROL_STRESS_RECOVERY=1`` (the recovery stress run) the provider is a
`RecoveringSteppingProvider` (it carries a dead runtime's turn on, and every run completes)
and the load kills nothing. Either way each send's record is also appended to
``OUT.sends`` as soon as it is answered, so a worker SIGKILLed mid-load leaves what every
answered send was told.
"""

from __future__ import annotations

import faulthandler
import fcntl
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    AgentHandle,
    CancelSignal,
    EventKind,
    MessageSource,
    ResumeRequest,
    SendResult,
    StartRequest,
    SubagentControl,
    SubagentControlError,
    TextBlock,
)
from tests.reliability.load import SETTLE_S, Load, Sent
from tests.reliability.stepping import Clock, SteppingProvider, SteppingRun, _Fate

__all__ = ["ExclusiveSteppingProvider", "ProcessLoad", "RecoveringSteppingProvider"]

PARENT = "stress-parent"
WATCHDOG_S = float(os.environ.get("SUBAGENT_CONTROL_STRESS_WATCHDOG_S", "150"))
LEASE_ENV = "SUBAGENT_CONTROL_STRESS_LEASE_S"
"""Set to open each worker's runtime with that ``lease_ttl_s`` (the restart stress run)."""
RECOVERY_ENV = "SUBAGENT_CONTROL_STRESS_RECOVERY"
"""Set to 1 for the recovery stress run's worker (`RecoveringSteppingProvider`, no kills)."""
MAX_RECOVERIES_ENV = "SUBAGENT_CONTROL_STRESS_MAX_RECOVERIES"
"""Set to open each worker's runtime with that ``max_recoveries`` (the recovery stress run:
its SIGKILLs are the schedule's, not a child killing its runtime)."""
PACE_ENV = "SUBAGENT_CONTROL_STRESS_PACE_S"
"""Set to a sender's mean pause after each send (`Load.pace_s`)."""


class ExclusiveSteppingProvider(SteppingProvider):
    """A `SteppingProvider` whose activations also hold a per-child file lock.

    ``overlaps`` counts the activations that found their child's lock already held, i.e.
    began while another activation of that child (in any process) had not yet ended.
    """

    def __init__(self, clock: Clock, *, seed: int, locks: Path) -> None:
        super().__init__(clock, seed=seed)
        self._locks = locks
        self._fds: dict[str, list[int]] = {}
        self.overlaps: list[str] = []

    def _enter(self, child_id: str) -> _Fate:
        # Every activation opens the file anew: flock locks belong to the open file
        # description, so two activations conflict even inside one process.
        fd = os.open(self._locks / f"{child_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._journal("overlap", child_id)
            with self._lock:
                self.overlaps.append(child_id)
        else:
            self._journal("enter", child_id)
        with self._lock:
            self._fds.setdefault(child_id, []).append(fd)
        return super()._enter(child_id)

    def _leave(self, child_id: str) -> None:
        super()._leave(child_id)
        with self._lock:
            fd = self._fds[child_id].pop()
        self._journal("leave", child_id)
        os.close(fd)  # releases the lock, if this activation held it

    def _journal(self, what: str, child_id: str, *more: str) -> None:
        """One line per activation's entry, exit or overlap (and recovery), in
        ``LOCKS/journal`` (shared by every process, appended whole), for reading an
        overlap's story afterwards: ``<monotonic> <pid> <what> <child_id> [more...]``."""
        line = " ".join((f"{time.monotonic():.6f}", str(os.getpid()), what, child_id, *more))
        line += "\n"
        fd = os.open(self._locks / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class RecoveringSteppingProvider(ExclusiveSteppingProvider):
    """An `ExclusiveSteppingProvider` that carries a dead runtime's turn on
    (``recovers_turns``) and whose every run completes (no failing or short fates), so that
    a run whose runtimes die and restart may end every Task ``completed``.

    A recovered activation (its open turn holds a ``task/recovered`` event) is journalled
    as ``recovered <child_id> <task_id> <from_runtime>`` when it begins: the moment the
    dead runtime's turn makes its next call here.
    """

    recovers_turns = True

    def _enter(self, child_id: str) -> _Fate:
        fate = super()._enter(child_id)
        return _Fate(fate.start_ticks, fate.steps, fate.dispose_ticks, "completed")

    def _begin(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> SteppingRun:
        if isinstance(request, ResumeRequest):
            recovered = [e for e in request.open_turn if e.kind == EventKind.TASK_RECOVERED]
            if recovered and isinstance(recovered[-1].data, dict):
                data = recovered[-1].data
                what = (str(data.get("task_id")), str(data.get("from_runtime")))
                self._journal("recovered", request.child_id, *what)
        return super()._begin(request, signal)


class _Witness:
    """The runtime as `Load` calls it, keeping each refused send's message: whether it
    names another runtime is how the test tells a refusal given after forwarding (or, on
    SQLite, one naming the holder) from a local one."""

    def __init__(self, control: SubagentControl) -> None:
        self._control = control
        self.tasks = control.tasks
        self._lock = threading.Lock()
        self.refusals: dict[str, str] = {}  # message text -> the refusal's message

    def send_message(
        self,
        parent: AgentHandle,
        child_id: str,
        message: Sequence[TextBlock],
        source: MessageSource | None = None,
    ) -> SendResult:
        try:
            return self._control.send_message(parent, child_id, message, source)
        except SubagentControlError as exc:
            with self._lock:
                self.refusals[message[0].text] = exc.message
            raise


@dataclass
class ProcessLoad(Load):
    """`Load` for one of several processes: texts carry the process's name, a `steered`
    reply makes its Task the one a kill aims at (it may run in another process), and a kill
    refused there is counted, not raised."""

    name: str = ""
    kill_refusals: Counter[str] = field(default_factory=Counter)
    killed: list[str] = field(default_factory=list)  # the Task ids its kills aimed at
    answered: Callable[[Sent], None] | None = None
    """Called with each send once it is answered (the worker's journal of sends)."""

    def _send(self, sent: Sent) -> None:
        sent.text = f"{self.name} {sent.text}"
        super()._send(sent)
        if self.answered is not None:
            self.answered(sent)
        if sent.route == "steered" and sent.task_id is not None:
            with self._cond:
                self.latest_task[sent.child_id] = sent.task_id

    def _kill_latest(self, child_id: str) -> None:
        with self._cond:
            if not self.latest_task[child_id]:
                return  # no Task of this child known here yet
            self.killed.append(self.latest_task[child_id])
        try:
            super()._kill_latest(child_id)
        except SubagentControlError as exc:
            # Its Task runs in another runtime: SQLite refuses (OWNERSHIP_CONFLICT);
            # PostgreSQL forwards the kill, NOT_DELIVERED if that runtime did not take it.
            with self._cond:
                self.kill_refusals[exc.code.value] += 1


def _record(sent: Sent, refusals: dict[str, str]) -> dict[str, object]:
    return {
        "record": "message",
        "text": sent.text,
        "child_id": sent.child_id,
        "source": sent.source.model_dump(mode="json"),
        "phase": sent.phase,
        "route": sent.route,
        "task_id": sent.task_id,
        "code": None if sent.code is None else sent.code.value,
        "refusal": refusals.get(sent.text),
    }


class _FenceWitness(logging.Handler):
    """When this runtime fences itself (its lease watchdog logs "lease lost"), and an
    activation of its provider is still live a fifth of the lease later (it has a quarter
    to stop in), every thread's stack goes to stderr: where a fenced activation hangs."""

    def __init__(self, provider: SteppingProvider, after_s: float) -> None:
        super().__init__(logging.WARNING)
        self._provider = provider
        self._after_s = after_s

    def emit(self, record: logging.LogRecord) -> None:
        if "lease lost" in record.getMessage():
            timer = threading.Timer(self._after_s, self._dump)
            timer.daemon = True
            timer.start()

    def _dump(self) -> None:
        if self._provider.live_total():
            sys.stderr.write(f"-- fenced, {self._provider.live_total()} activation(s) live:\n")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def main(url: str, name: str, children: list[str], sends: int, locks: Path, out: Path) -> None:
    # Warnings (store retries, fencing, takeovers) to stderr, which the test keeps.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    seed = int(os.environ["SUBAGENT_CONTROL_STRESS_SEED"])
    clock = Clock()
    recovery = os.environ.get(RECOVERY_ENV) == "1"
    kind = RecoveringSteppingProvider if recovery else ExclusiveSteppingProvider
    provider = kind(clock, seed=seed, locks=locks)
    options: dict[str, Any] = {}
    if LEASE_ENV in os.environ:
        options["lease_ttl_s"] = float(os.environ[LEASE_ENV])
    if MAX_RECOVERIES_ENV in os.environ:
        options["max_recoveries"] = int(os.environ[MAX_RECOVERIES_ENV])
    control = SubagentControl.open(url, close_timeout_s=SETTLE_S, **options)
    lease_s = float(options.get("lease_ttl_s", 10.0))
    witness_of_fences = _FenceWitness(provider, lease_s / 5)
    logging.getLogger("controlplane.runtime.lease._own_lease").addHandler(witness_of_fences)
    control.providers.register(provider)
    parent = control.agents.register(PARENT)
    latest = {child_id: "" for child_id in children}  # no Task of ours to kill yet
    witness = _Witness(control)
    runtime = cast(SubagentControl, witness)  # all `Load` calls: send_message, tasks
    journal = out.with_name(out.name + ".sends").open("a", encoding="utf-8", buffering=1)
    written = threading.Lock()

    def answered(sent: Sent) -> None:  # one whole line per send, in the kernel at once
        with written:
            journal.write(json.dumps(_record(sent, witness.refusals)) + "\n")

    load = ProcessLoad(runtime, parent, provider, children, sends, latest, name=name,
                       answered=answered)  # fmt: skip
    if recovery:
        load.kill_rate = 0.0
    load.pace_s = float(os.environ.get(PACE_ENV, "0"))
    print(f"ready {control.runtime_id}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    load.run()
    clock.drain()  # nothing here waits for a tick any more: our own activations settle
    print("sent", flush=True)
    if sys.stdin.readline().strip() != "close":
        return
    for task in control.tasks.list(parent):
        if task.runtime_id == control.runtime_id and not task.status.is_terminal:
            control.tasks.wait(task.id, timeout=SETTLE_S, requester=parent)
    live_at_close = provider.live_total()
    control.close()
    figures = {
        "record": "figures",
        "name": name,
        "runtime_id": control.runtime_id,
        "errors": [repr(exc) for exc in load.errors],
        "activations_entered": provider.entered,
        "starts_rolled_back": provider.rollbacks,
        "max_live_activations_per_child": max(provider.max_live.values(), default=0),
        "overlaps": provider.overlaps,
        "live_at_close": live_at_close,
        "kills_by_phase": dict(load.kills),
        "kill_refusals": dict(load.kill_refusals),
        "killed": load.killed,
    }
    with out.open("w", encoding="utf-8") as file:
        for sent in load.sent:
            file.write(json.dumps(_record(sent, witness.refusals)) + "\n")
        file.write(json.dumps(figures) + "\n")
    print("closed", flush=True)


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        sys.argv[3].split(","),
        int(sys.argv[4]),
        Path(sys.argv[5]),
        Path(sys.argv[6]),
    )
