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
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    AgentHandle,
    MessageSource,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TextBlock,
)
from tests.reliability.load import SETTLE_S, Load, Sent
from tests.reliability.stepping import Clock, SteppingProvider, _Fate

__all__ = ["ExclusiveSteppingProvider", "ProcessLoad"]

PARENT = "stress-parent"
WATCHDOG_S = float(os.environ.get("SUBAGENT_CONTROL_STRESS_WATCHDOG_S", "150"))
LEASE_ENV = "SUBAGENT_CONTROL_STRESS_LEASE_S"
"""Set to open each worker's runtime with that ``lease_ttl_s`` (the restart stress run)."""


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

    def _journal(self, what: str, child_id: str) -> None:
        """One line per activation's entry, exit or overlap, in ``LOCKS/journal`` (shared
        by every process, appended whole), for reading an overlap's story afterwards."""
        line = f"{time.monotonic():.6f} {os.getpid()} {what} {child_id}\n"
        fd = os.open(self._locks / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


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

    def _send(self, sent: Sent) -> None:
        sent.text = f"{self.name} {sent.text}"
        super()._send(sent)
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


def main(url: str, name: str, children: list[str], sends: int, locks: Path, out: Path) -> None:
    # Warnings (store retries, fencing, takeovers) to stderr, which the test keeps.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    seed = int(os.environ["SUBAGENT_CONTROL_STRESS_SEED"])
    clock = Clock()
    provider = ExclusiveSteppingProvider(clock, seed=seed, locks=locks)
    lease = {"lease_ttl_s": float(os.environ[LEASE_ENV])} if LEASE_ENV in os.environ else {}
    control = SubagentControl.open(url, close_timeout_s=SETTLE_S, **lease)
    control.providers.register(provider)
    parent = control.agents.register(PARENT)
    latest = {child_id: "" for child_id in children}  # no Task of ours to kill yet
    witness = _Witness(control)
    runtime = cast(SubagentControl, witness)  # all `Load` calls: send_message, tasks
    load = ProcessLoad(runtime, parent, provider, children, sends, latest, name=name)
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
