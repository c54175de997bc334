"""Measurements that need a fresh process: resident memory, threads, ready-after-restart.

Run as ``python -m benchmarks._probe MODE ARGS…`` (`run_probe` does, and parses the JSON
object it prints).

- ``live URL COUNT``: open a control plane, start ``COUNT`` children that stay running
  (each published: one steer returns), and report threads and VmRSS before and after.
- ``ready URL CHILD_ID PARENT``: a restart — ``SubagentControl.open`` then the first
  ``send_message`` to one idle child, until ``provider.resume`` is called; report the times
  (opened, send answered, resume called) and the process's threads and VmRSS at that point.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import PARENT_SESSION, proc_status
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from controlplane import ContinuableStartSpec, SubagentControl, TextBlock

__all__ = ["run_probe"]

_MESSAGE = [TextBlock(text="continue with the next step")]
_REPO = Path(__file__).resolve().parents[1]
_PROBE_TIMEOUT_S = 600


def run_probe(
    *args: str, module: str = "benchmarks._probe", timeout_s: float = _PROBE_TIMEOUT_S
) -> dict[str, Any]:
    """Run one probe of ``module`` (``python -m module *args``) in a fresh interpreter; the
    JSON object its last line of output is."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} probe {args[0]} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _live(url: str, count: int) -> dict[str, Any]:
    control = SubagentControl.open(url)
    provider = BenchProvider()
    control.providers.register(provider)
    parent = control.agents.register(PARENT_SESSION)
    try:
        gc.collect()
        before = proc_status()
        t0 = time.perf_counter()
        children = [
            control.start_continuable(
                ContinuableStartSpec(
                    provider=PROVIDER_NAME, label="bench", prompt=_MESSAGE, parent=parent
                )
            ).child_id
            for _ in range(count)
        ]
        for child_id in children:
            result = control.send_message(parent, child_id, _MESSAGE)
            assert result.route == "steered", result
        started_s = time.perf_counter() - t0
        gc.collect()
        after = proc_status()
    finally:
        provider.release_all()
        control.close()
    return {"before": before, "after": after, "start_s": started_s}


def _ready(url: str, child_id: str, parent_session: str) -> dict[str, Any]:
    # Load what a restarted harness has loaded before it opens its store.
    import sqlalchemy.dialects.sqlite  # noqa: F401

    t0 = time.perf_counter()
    control = SubagentControl.open(url)
    try:
        provider = BenchProvider()
        control.providers.register(provider)
        parent = control.agents.register(parent_session)
        opened = time.perf_counter()
        result = control.send_message(parent, child_id, _MESSAGE)
        sent = time.perf_counter()
        called, run, _request = provider.wait_resumed(child_id)
        status = proc_status()
        run.release()
        control.tasks.wait(result.task_id, timeout=60.0, requester=parent)
    finally:
        control.close()
    return {
        "open_s": opened - t0,
        "sent_s": sent - t0,
        "ready_s": called - t0,
        "status": status,
    }


def main(argv: list[str]) -> int:
    """Run one probe and print its JSON result."""
    mode, *args = argv
    if mode == "live":
        out = _live(args[0], int(args[1]))
    elif mode == "ready":
        out = _ready(args[0], args[1], args[2])
    else:
        raise SystemExit(f"unknown probe {mode!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
