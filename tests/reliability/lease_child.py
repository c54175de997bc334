"""The lease tests' runtime process: one runtime running one live child, on cue.

Usage: ``python tests/reliability/lease_child.py URL LEASE_TTL_S [CLOCK_SHIFT_S]``

It starts one child whose turn runs until released and prints ``ready <runtime id>
<child id> <task id>``. Then, for each line on stdin:

- ``steady``: ``steady <seconds>``, for how long its renewals have run unbroken (the
  test waits on it instead of sleeping: once it exceeds a lease, this runtime judges
  lapsed leases, and has swept at least once since).
- ``send <child id>``: sends that child a message: ``started <task id>``, ``steered <task
  id>`` or ``refused <CODE>``.
- ``release``: ends its child's turn and prints ``settled <status>`` once its Task settles.
- ``quit`` (or end of input): closes the runtime.

With ``LEASE_CHILD_PROBE`` set to a folder, every activation holds that child's
`pg_fault.LockProbe` lock while it acts, so two at once are recorded there.

``CLOCK_SHIFT_S`` moves this process's wall clock (every ``utcnow`` of the package and
``time.time``) by that many seconds, as a host whose clock is off would: the clock-skew
tests run one such process beside a true one. A watchdog ends it after ``WATCHDOG_S``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import controlplane.contract._session
import persistence
from controlplane import (
    ContinuableStartSpec,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import LockProbe
from tests.support import wait_published

PARENT = "lease-parent"
WATCHDOG_S = 120.0
_TRUE_UTCNOW = controlplane.contract._session.utcnow


def shift_clock(seconds: float) -> None:
    """Move this process's wall clock by ``seconds``: every module's ``utcnow`` (bound by
    name at import) and ``time.time``. The monotonic and boot clocks stay true."""

    def shifted() -> datetime:
        return _TRUE_UTCNOW() + timedelta(seconds=seconds)

    true_time: Callable[[], float] = time.time
    time.time = lambda: true_time() + seconds
    for module in list(sys.modules.values()):
        if getattr(module, "utcnow", None) is _TRUE_UTCNOW:
            module.utcnow = shifted  # type: ignore[attr-defined]


class ProbedProvider(FakeProvider):
    """A `FakeProvider` whose activations hold their child's probe lock while they act."""

    def __init__(self, probe: LockProbe) -> None:
        super().__init__()
        self._probe = probe

    def _enter(self, child_id: str) -> None:
        super()._enter(child_id)
        self._probe.enter(child_id, f"process {os.getpid()}")

    def _leave(self, child_id: str) -> None:
        self._probe.exit(child_id)
        super()._leave(child_id)


def main(url: str, lease_ttl_s: float, shift_s: float) -> None:
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    assert persistence.SqlStore is not None  # every store module is loaded: shift them all
    if shift_s:
        shift_clock(shift_s)
    control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s, close_timeout_s=5.0)
    if shift_s:
        shift_clock(shift_s)  # and whatever the open loaded
    probe = os.environ.get("LEASE_CHILD_PROBE")
    provider = FakeProvider() if probe is None else ProbedProvider(LockProbe(probe))
    control.providers.register(provider)
    parent = control.agents.register(PARENT)
    gate = threading.Event()
    provider.plan(result_gate=gate)
    started = control.start_continuable(
        ContinuableStartSpec(
            provider=provider.name, label="live", parent=parent, prompt=[TextBlock(text="hi")]
        )
    )
    wait_published(control, started.child_id)
    print(f"ready {control.runtime_id} {started.child_id} {started.task_id}", flush=True)
    runtime = control._runtime
    assert runtime is not None
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            break
        if word == "steady":
            print(f"steady {runtime.renewals.steady_for():.3f}", flush=True)
        elif word == "send":
            provider.default_plan()
            try:
                sent = control.send_message(parent, arg, [TextBlock(text="from elsewhere")])
            except SubagentControlError as exc:
                print(f"refused {exc.code.value}", flush=True)
            else:
                print(f"{sent.route} {sent.task_id}", flush=True)
        elif word == "release":
            gate.set()
            try:
                done = control.tasks.wait(started.task_id, timeout=30.0, requester=parent)
                status = done.status
            except SubagentControlError as exc:
                status = TaskStatus.FAILED
                print(f"wait failed {exc.code.value}", file=sys.stderr, flush=True)
            print(f"settled {status.value}", flush=True)
    control.close()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
