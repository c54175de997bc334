"""Reused threads for agent loops: a turn starts on an idle thread, not a new one.

Handing a loop to a thread that waits for one (`controlplane.contract.IdleThreads`, shared
with the actor runtime's workers) costs one wake-up; starting a thread costs as much as a
short scripted turn's own work on its loop. While it runs a loop, a thread bears that
loop's name, so a child's loop is found by its name and runs on a thread of its own; idle,
it is named `IDLE_NAME`, which no loop's name starts with. Every thread is a daemon: a
model that ignores cancellation must not keep the process alive.

The providers do not depend on the actor runtime (importing it costs a provider-only
process ~200 ms), and a loop here needs what an actor does not: its exact name, and a
handle that says when it has returned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from controlplane.contract import IdleThreads

__all__ = ["IDLE_NAME", "LoopThread", "LoopThreads", "loop_threads"]

IDLE_NAME = "agent-loop-idle"
"""The name of a pooled thread that runs no loop."""


class LoopThread:
    """One loop's run on a pooled thread.

    Attributes:
        thread: The thread it runs on.
    """

    __slots__ = ("_returned", "thread")

    def __init__(self, thread: threading.Thread, returned: threading.Event) -> None:
        self.thread = thread
        self._returned = returned

    def join(self, timeout_s: float) -> bool:
        """Wait until the loop has returned and its thread no longer bears its name;
        whether it did within ``timeout_s``."""
        return self._returned.wait(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the loop has not returned yet."""
        return not self._returned.is_set()


class LoopThreads(IdleThreads):
    """Daemon threads, each running one agent loop at a time."""

    def __init__(self, *, max_idle: int = 8, idle_s: float = 30.0) -> None:
        super().__init__(daemon=True, max_idle=max_idle, idle_s=idle_s, idle_name=IDLE_NAME)

    def start(self, loop: Callable[[], None], name: str) -> LoopThread:
        """Run ``loop`` on an idle thread, or on a new one, named ``name`` while it runs.

        A loop that raises ends its thread, which is never reused; its handle still says
        it returned.

        Raises:
            RuntimeError: A new thread could not start (no idle one, and the process is at
                its thread limit); ``loop`` will never run.
        """
        returned = threading.Event()
        return LoopThread(self.launch(loop, name, returned.set), returned)


loop_threads = LoopThreads()
"""The process's threads for agent loops."""

os.register_at_fork(after_in_child=loop_threads._reset)
