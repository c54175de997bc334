"""One runtime of the scale-out benchmark: an OS process with its own children on the
shared PostgreSQL store (`benchmarks.scaleout` starts 1, 2 or 4 of them).

Run as ``python benchmarks/_scaleout_worker.py URL HELD IDLE THREADS`` with the packages
to measure first on ``PYTHONPATH`` (this tree's, or another tree's under ``--against``).
It starts ``HELD`` children whose runs stay open (steer targets) and ``IDLE`` children on
an instant `ScriptedModel` (each send runs a whole turn), prints ``READY <json>`` (its
runtime id and held children), then runs one phase per line read from stdin
(``{"phase": ..., "seconds": S, "targets": [...]}``) on ``THREADS`` closed-loop threads and
prints ``DONE <json>``: operations, latency samples, and the process CPU seconds the phase
took. Phases: ``turns`` (a send to an idle child of its own, until its Task completed),
``local`` (a steer into a held child of its own), ``forwarded`` (a steer into ``targets``,
held children of other runtimes). An empty line or end of input closes it; a watchdog
ends it after `WATCHDOG_S` whatever happens.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

WATCHDOG_S = 900.0
PARENT = "bench-scaleout-parent"


def main(url: str, held: int, idle: int, threads: int) -> None:
    from benchmarks._provider import PROVIDER_NAME, BenchProvider
    from controlplane import (
        ContinuableStartSpec,
        InProcessProvider,
        MessageSource,
        ScriptedModel,
        SubagentControl,
        TaskStatus,
        TextBlock,
    )

    threading.Timer(WATCHDOG_S, lambda: os._exit(3)).start()
    control = SubagentControl.open(url)
    bench = BenchProvider()
    try:
        control.providers.register(bench)
        control.providers.register(InProcessProvider(ScriptedModel(["done"])))
        parent = control.agents.register(PARENT)
        message = [TextBlock(text="one more step")]
        source = MessageSource(kind="coordinator", sender_session_id=PARENT)

        def start(provider: str) -> tuple[str, str]:
            spec = ContinuableStartSpec(
                provider=provider, label="scaleout", prompt=[TextBlock(text="go")], parent=parent
            )
            started = control.start_continuable(spec)
            return started.child_id, started.task_id

        def steer(child_id: str) -> None:
            result = control.send_message(parent, child_id, message, source)
            if result.route != "steered":
                raise AssertionError(f"expected a steer, got {result}")

        def turn(child_id: str) -> None:
            sent = control.send_message(parent, child_id, message, source)
            done = control.tasks.wait(sent.task_id, timeout=60.0, requester=parent)
            if done.status is not TaskStatus.COMPLETED:
                raise AssertionError(f"a turn ended {done.status}")

        held_ids = [start(PROVIDER_NAME)[0] for _ in range(held)]
        for child_id in held_ids:
            steer(child_id)  # published: a steer returns once it is
        idle_ids = []
        for _ in range(idle):
            child_id, task_id = start("inprocess")
            control.tasks.wait(task_id, timeout=60.0, requester=parent)
            idle_ids.append(child_id)
        ready = {"runtime_id": control.runtime_id, "held": held_ids}
        print("READY " + json.dumps(ready), flush=True)
        for line in sys.stdin:
            if not line.strip():
                break
            command: dict[str, Any] = json.loads(line)
            phase = command["phase"]
            if phase == "turns":
                # Each thread its own children: one child never runs two turns at once.
                shares = [idle_ids[i::threads] for i in range(threads)]
                ops = [lambda share=share: turn(random.choice(share)) for share in shares]
            else:
                targets = held_ids if phase == "local" else list(command["targets"])
                ops = [lambda targets=targets: steer(random.choice(targets))] * threads
            print("DONE " + json.dumps(_run_phase(ops, float(command["seconds"]))), flush=True)
    finally:
        bench.release_all()
        control.close()
        os._exit(0)  # the watchdog timer is a live thread


def _run_phase(ops: list[Any], seconds: float) -> dict[str, Any]:
    samples: list[list[float]] = [[] for _ in ops]
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def loop(op: Any, out: list[float]) -> None:
        try:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                op()
                out.append(time.perf_counter() - t0)
        except Exception as exc:  # reported to the benchmark, which fails the section
            errors.append(f"{type(exc).__name__}: {exc}")

    cpu0, wall0 = time.process_time(), time.monotonic()
    workers = [
        threading.Thread(target=loop, args=(op, out)) for op, out in zip(ops, samples, strict=True)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    latencies = [s for out in samples for s in out]
    return {
        "ops": len(latencies),
        "wall_s": time.monotonic() - wall0,
        "cpu_s": time.process_time() - cpu0,
        "latencies": latencies,
        "errors": errors,
    }


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
