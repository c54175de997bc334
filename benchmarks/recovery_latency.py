"""How soon a running turn goes on after its runtime ends (SPEC §9 "Recovery", "Handover on
close"), measured with real processes on one host.

Usage: ``python -m benchmarks.recovery_latency --db URL [--lease 3] [--runs 5]
[--scenarios sigkill,sigstop,close,provider]``

Each run starts a runtime process (`tests/reliability/recovery_child.py`) whose child is
stuck in a model call, while this process holds a second runtime on the same store with the
child's provider and a model that notes when it is first called. Then, per scenario:

- ``sigkill``: the first runtime is SIGKILLed. Same host and boot: its process is seen gone
  at once, so the wait is the survivor's sweep (every third of the lease);
- ``sigstop``: the first runtime is SIGSTOPped, as a runtime on another host looks when it
  dies (nothing says so but its lease): the wait is the lease, the survivor's own steady
  renewals, and the next sweep;
- ``close``: the first runtime calls ``close()`` (handover): its row is closed, and it
  announces the handed-over turn (`persistence.Takeable`): the survivor takes it on that
  wake-up (PostgreSQL: a notification; SQLite: its poll of the takeable Tasks), its next
  sweep being the fallback;
- ``provider``: no death: a runtime without the child's provider (a front, in this
  process) resumes the idle child, leaves the Task for a runtime with the provider and
  announces it; the wait is from the send to the survivor's first model call of that turn.

Printed as JSON: for each scenario the seconds from the death (the signal, or the start of
``close()``) to the recovered turn's first model call in the survivor, min/median/max, with
the lease. All times are on the host's monotonic clock, shared by the processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    InProcessProvider,
    SubagentControl,
    TextBlock,
)
from controlplane.models import ModelReply, ModelRequest

CHILD = Path(__file__).resolve().parents[1] / "tests" / "reliability" / "recovery_child.py"
PARENT = "recovery-parent"
WAIT_S = 120.0


class NotingModel:
    """Answers at once, noting (monotonic) when it was first called."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.at = 0.0

    def complete(self, request: ModelRequest, signal_: CancelSignal) -> ModelReply:
        del request, signal_
        if not self.called.is_set():
            self.at = time.monotonic()
            self.called.set()
        return ModelReply(text="recovered")


def provider(url: str, lease_s: float) -> float:
    """The ``provider`` scenario: seconds from a provider-less front's resume to the
    first model call of its turn in a runtime that has the provider."""
    with SubagentControl.open(url, lease_ttl_s=lease_s) as first:
        first.providers.register(InProcessProvider(NotingModel()))
        parent = first.agents.register(PARENT)
        started = first.start_continuable(ContinuableStartSpec(
            provider="inprocess", label="idle", prompt=[TextBlock(text="do it")], parent=parent
        ))  # fmt: skip
        first.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    model = NotingModel()
    with (
        SubagentControl.open(url, lease_ttl_s=lease_s) as worker,
        SubagentControl.open(url, lease_ttl_s=lease_s) as front,
    ):
        worker.providers.register(InProcessProvider(model))
        parent = front.agents.register(PARENT)
        began = time.monotonic()
        sent = front.send_message(parent, started.child_id, [TextBlock(text="go on")])
        if not model.called.wait(WAIT_S):
            raise SystemExit("provider: the worker never took the task")
        front.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        return model.at - began


def one(url: str, scenario: str, lease_s: float, scratch: Path) -> float:
    if scenario == "provider":
        return provider(url, lease_s)
    mode = "close" if scenario == "close" else "model"
    env = {**os.environ, "PYTHONPATH": str(CHILD.parents[2])}
    proc = subprocess.Popen(
        # close_timeout_s 0: the stuck turn is handed over at once (no grace to wait out).
        [sys.executable, str(CHILD), url, mode, str(scratch / "runs"), "0", str(lease_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        line = proc.stdout.readline()
        if not line.startswith("READY "):
            raise SystemExit(f"the runtime did not get ready: {line!r}")
        ready = json.loads(line.removeprefix("READY "))
        model = NotingModel()
        with SubagentControl.open(url, lease_ttl_s=lease_s) as survivor:
            survivor.providers.register(InProcessProvider(model))
            parent = survivor.agents.register(PARENT)
            # The survivor's own renewals must have run a full lease before it may take a
            # lapsed lease for death (an outage says nothing): measured from a steady state (and
            # from the same place between two sweeps every time).
            time.sleep(lease_s * 1.1)
            if scenario == "close":
                began = time.monotonic()
                proc.stdin.write("close\n")
                proc.stdin.flush()
            else:
                began = time.monotonic()
                proc.send_signal(signal.SIGKILL if scenario == "sigkill" else signal.SIGSTOP)
                if scenario == "sigkill":
                    proc.wait(10)  # reaped, as a supervisor reaps it: its pid is gone
            if not model.called.wait(WAIT_S):
                raise SystemExit(f"{scenario}: the turn was not recovered")
            survivor.tasks.wait(ready["task_id"], timeout=WAIT_S, requester=parent)
            return model.at - began
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.send_signal(signal.SIGCONT)
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="a store URL (each run uses a fresh store)")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scenarios", default="sigkill,sigstop,close,provider",
                        help="comma-separated: sigkill, sigstop, close, provider")  # fmt: skip
    args = parser.parse_args()
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"recovery-latency-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"lease_ttl_s": args.lease, "backend": args.db.split(":")[0]}
    for scenario in args.scenarios.split(","):
        times = []
        for n in range(args.runs):
            url = args.db
            if url.startswith("sqlite"):
                url = f"sqlite:///{scratch}/{scenario}-{n}.db"
            times.append(one(url, scenario, args.lease, scratch))
        results[scenario] = {
            "min_s": round(min(times), 3),
            "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
