"""A Task whose runtime was SIGKILLed mid-turn is settled ``interrupted`` by the next
runtime's sweep when it does not recover it (``recover=False``), and its usage is what its
turn wrote before the kill (summed from the turn's events by the settling transaction), in
every runtime after. Recovered instead (SPEC §9), the turn's spend is counted once: what the
dead runtime's calls wrote plus what the recovered run's calls wrote, in the Task and in
the child's usage alike."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import (
    InProcessProvider,
    Price,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    Usage,
)
from tests.support import WAIT_S

SCRIPT = Path(__file__).with_name("spend_child.py")
REPO = SCRIPT.parents[2]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def killed(store_url: str) -> Iterator[dict[str, str]]:
    """Run `spend_child.py` until its first model call is written, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded: the script exits within its lifetime
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        ready: dict[str, str] = json.loads(line.removeprefix("READY "))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        yield ready
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_killed_runtimes_task_is_swept_interrupted_with_what_its_turn_had_spent(
    store_url: str, killed: dict[str, str]
) -> None:
    first_call = Usage(input_tokens=10, output_tokens=2, model_calls=1, cost=14.0)
    # Same host, its process gone: swept by this runtime as it opens.
    with SubagentControl.open(store_url, lease_ttl_s=30.0, recover=False) as control:
        swept = control.tasks.wait(killed["task_id"], timeout=WAIT_S, requester="sweep-parent")
        assert swept.status is TaskStatus.INTERRUPTED
        assert swept.usage == first_call
        assert control.usage("sweep-parent", killed["child_id"]) == first_call
        (notice,) = control.tasks.drain_notices("sweep-parent")
        assert "(spent 12 tokens, 1 model call, $14.0000)" in notice.summary

    with SubagentControl.open(store_url) as later:
        assert later.tasks.get(killed["task_id"], requester="sweep-parent").usage == first_call


def test_a_recovered_turn_counts_its_spend_once(store_url: str, killed: dict[str, str]) -> None:
    first_call = Usage(input_tokens=10, output_tokens=2, model_calls=1, cost=14.0)
    second = Usage(input_tokens=3, output_tokens=1, model_calls=1, cost=5.0)
    price = {"m": Price(input=1_000_000, output=2_000_000)}
    with SubagentControl.open(store_url, lease_ttl_s=30.0, prices=price) as control:
        model = ScriptedModel(["done"], usage=Usage(input_tokens=3, output_tokens=1))
        control.providers.register(InProcessProvider(model))
        done = control.tasks.wait(killed["task_id"], timeout=WAIT_S, requester="sweep-parent")
        assert done.status is TaskStatus.COMPLETED, done
        assert done.recoveries == 1
        total = first_call + second
        assert done.usage == total
        assert control.usage("sweep-parent", killed["child_id"]) == total

    with SubagentControl.open(store_url) as later:
        assert later.tasks.get(killed["task_id"], requester="sweep-parent").usage == total
