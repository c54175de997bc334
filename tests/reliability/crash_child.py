"""The crash test's child process: a control plane under write load, waiting to be killed.

Usage: ``python tests/reliability/crash_child.py URL``

It resumes every child of ``crash-parent`` already in the store (the previous process was
killed), starts two ``loop`` and two ``cycle`` children and keeps resuming the ``cycle``
children. Once every looping child has written events and every cycling child has completed
two turns in this process it prints one line ``READY <json>``, then steers the ``loop``
children round after round, printing ``ACK <child_id> <text>`` for every message ``steered``,
until it is killed. A watchdog ends it after ``WATCHDOG_S`` regardless, so a test that dies
cannot leave it behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    EventKind,
    SubagentControl,
    SubagentControlError,
    TextBlock,
)
from tests.reliability.crash_provider import NAME, CrashProvider

PARENT = "crash-parent"
WATCHDOG_S = 60.0
LOOP_PROGRESS = 10
CYCLES = 2


class Driver:
    """Keeps every child busy and reports readiness once."""

    def __init__(self, control: SubagentControl, parent: AgentHandle) -> None:
        self.control = control
        self.parent = parent
        self.loopers: list[str] = []
        self.cyclers: list[str] = []
        self._cond = threading.Condition()
        self._appends: Counter[str] = Counter()
        self._cycles: Counter[str] = Counter()

    def progress(self, child_id: str) -> None:
        with self._cond:
            self._appends[child_id] += 1
            self._cond.notify_all()

    def start(self, behaviour: str, number: int) -> None:
        start = self.control.start_continuable(
            ContinuableStartSpec(
                provider=NAME,
                label=f"{behaviour} {number}",
                prompt=[TextBlock(text=f"{behaviour} child {number}")],
                parent=self.parent,
                inputs={"behaviour": behaviour},
            )
        )
        self._adopt(start.child_id, behaviour, start.task_id)

    def resume(self, child_id: str, behaviour: str) -> None:
        result = self.control.send_message(
            self.parent, child_id, [TextBlock(text="continue after the crash")]
        )
        self._adopt(child_id, behaviour, result.task_id)

    def _adopt(self, child_id: str, behaviour: str, task_id: str) -> None:
        if behaviour == "cycle":
            self.cyclers.append(child_id)
            threading.Thread(target=self._cycle, args=(child_id, task_id), daemon=True).start()
        else:
            self.loopers.append(child_id)

    def _cycle(self, child_id: str, task_id: str) -> None:
        while True:
            self.control.tasks.wait(task_id, timeout=WATCHDOG_S, requester=self.parent)
            with self._cond:
                self._cycles[child_id] += 1
                self._cond.notify_all()
            result = self.control.send_message(
                self.parent, child_id, [TextBlock(text=f"cycle {self._cycles[child_id]}")]
            )
            task_id = result.task_id

    def steer_forever(self) -> None:
        number = 0
        while True:
            for child_id in list(self.loopers):
                number += 1
                message = f"steer {os.getpid()}-{number}"
                # A refusal (its turn is settling) is fine: the next round tries again.
                with contextlib.suppress(SubagentControlError):
                    result = self.control.send_message(
                        self.parent, child_id, [TextBlock(text=message)]
                    )
                    if result.route == "steered":
                        # Acknowledged, so durable: the test looks for it after the kill.
                        print(f"ACK {child_id} {message}", flush=True)

    def wait_ready(self) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    all(self._appends[c] >= LOOP_PROGRESS for c in self.loopers)
                    and all(self._cycles[c] >= CYCLES for c in self.cyclers)
                ),
                timeout=WATCHDOG_S,
            )


def behaviour_of(control: SubagentControl, child_id: str) -> str:
    assert control.store is not None
    for event in control.store.load(child_id).events:
        if event.kind == EventKind.DESCRIPTOR:
            return str(event.data.get("inputs", {}).get("behaviour", "loop"))
    return "loop"


def main(url: str) -> None:
    threading.Timer(WATCHDOG_S, os._exit, args=(3,)).start()
    control = SubagentControl.open(url)
    parent = control.agents.register(PARENT)
    driver = Driver(control, parent)
    control.providers.register(CrashProvider("crash", driver.progress))
    assert control.store is not None
    existing = [meta.child_id for meta in control.store.list_children(PARENT)]
    for child_id in existing:
        driver.resume(child_id, behaviour_of(control, child_id))
    for number in range(2):
        driver.start("loop", number)
        driver.start("cycle", number)
    driver.wait_ready()
    ready = {"resumed": len(existing), "loopers": driver.loopers, "cyclers": driver.cyclers}
    print("READY " + json.dumps(ready), flush=True)
    driver.steer_forever()


if __name__ == "__main__":
    main(sys.argv[1])
