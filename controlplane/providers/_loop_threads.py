"""Reused threads for agent loops: a turn starts on an idle thread, not a new one.

Starting a thread costs a few hundred microseconds on these machines (the starter waits
until the new thread runs), as much as a short scripted turn's own work on its loop;
handing a loop to a thread that waits for one costs one wake-up. While it runs a loop, a
thread bears that loop's name, so a child's loop is found by its name and runs on a
thread of its own; idle, it is named `IDLE_NAME`, which no loop's name starts with. Each
loop starts with what a new thread would: an empty `contextvars.Context` and the
`threading` module's trace and profile hooks. Every thread is a daemon: a model that
ignores cancellation must not keep the process alive. At most `LoopThreads.max_idle`
threads wait, each for `LoopThreads.idle_s` seconds; a loop goes to the one that went
idle last (its CPU the likeliest to be awake still).

The actor runtime pools its own threads (`actors`); the providers do not depend on it
(importing it costs a provider-only process ~200 ms), and a loop here needs what an actor
does not: its exact name, and a handle that says when it has returned.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["IDLE_NAME", "LoopThread", "LoopThreads", "loop_threads"]

IDLE_NAME = "agent-loop-idle"
"""The name of a pooled thread that runs no loop."""


class LoopThread:
    """One loop's run on a pooled thread.

    Attributes:
        thread: The thread it runs on.
    """

    __slots__ = ("_returned", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self._returned = threading.Event()

    def join(self, timeout_s: float) -> bool:
        """Wait until the loop has returned and its thread no longer bears its name;
        whether it did within ``timeout_s``."""
        return self._returned.wait(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the loop has not returned yet."""
        return not self._returned.is_set()


class _Job:
    __slots__ = ("handle", "loop", "name")

    def __init__(self, loop: Callable[[], None], name: str, handle: LoopThread) -> None:
        self.loop, self.name, self.handle = loop, name, handle


class _Waiting:
    """One idle thread's hand-off: ``job`` set, then ``wake`` released, by whoever takes
    it off the stack (a starter, or `LoopThreads.drain` with None)."""

    __slots__ = ("job", "thread", "wake")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: _Job | None = None


class LoopThreads:
    """Daemon threads, each running one agent loop at a time.

    Invariant, under ``_lock``: ``_waiting`` holds exactly the threads that wait for a
    loop and have not been handed one; a thread taken off it is always handed a loop (or
    None: it ends).
    """

    def __init__(self, *, max_idle: int = 8, idle_s: float = 30.0) -> None:
        self.max_idle = max_idle
        """How many threads may wait for a loop at once; one freed beyond it ends."""
        self.idle_s = idle_s
        """How long a thread waits for a loop before it ends."""
        self._reset()

    def _reset(self) -> None:
        # Also the state of a forked child, where none of the parent's threads exists.
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []

    def start(self, loop: Callable[[], None], name: str) -> LoopThread:
        """Run ``loop`` on an idle thread, or on a new one, named ``name`` while it runs.

        Raises:
            RuntimeError: A new thread could not start (no idle one, and the process is at
                its thread limit); ``loop`` will never run.
        """
        with self._lock:
            if self._waiting:
                waiting = self._waiting.pop()
                handle = LoopThread(waiting.thread)
                waiting.job = _Job(loop, name, handle)
                waiting.wake.release()
                return handle
        # Handed over in a list the thread empties: a thread keeps its ``args`` for as long
        # as it runs, and a job there would keep its finished run alive with it.
        first: list[_Job] = []
        thread = threading.Thread(target=self._work, args=(first,), name=name, daemon=True)
        handle = LoopThread(thread)
        first.append(_Job(loop, name, handle))
        thread.start()
        return handle

    def idle(self) -> int:
        """How many threads wait for a loop right now."""
        with self._lock:
            return len(self._waiting)

    def drain(self) -> None:
        """End every idle thread (the next `start` starts a new one)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            for one in waiting:
                one.wake.release()  # its job stays None: it ends

    def _work(self, first: list[_Job]) -> None:
        thread = threading.current_thread()
        job: _Job | None = first.pop()
        waiting = _Waiting(thread)
        while job is not None:
            thread.name = job.name
            # What a new thread starts with: the module's hooks and an empty context.
            sys.settrace(threading.gettrace())
            sys.setprofile(threading.getprofile())
            try:
                contextvars.Context().run(job.loop)
            finally:
                # Renamed before the handle says it returned: a joined loop's name is gone.
                # A loop that let an exception out ends its thread, never reused.
                thread.name = IDLE_NAME
                job.handle._returned.set()
            del job  # nothing of the finished run stays reachable from an idle thread
            job = self._next(waiting)

    def _next(self, waiting: _Waiting) -> _Job | None:
        """The next loop for this thread, or None: it ends."""
        with self._lock:
            if len(self._waiting) >= self.max_idle:
                return None
            self._waiting.append(waiting)
        if not waiting.wake.acquire(timeout=self.idle_s):
            with self._lock:
                if waiting in self._waiting:  # nobody took it: it ends
                    self._waiting.remove(waiting)
                    return None
            # Taken off the stack as the wait ran out: its loop (or None) is on its way.
            waiting.wake.acquire()
        job, waiting.job = waiting.job, None
        return job


loop_threads = LoopThreads()
"""The process's threads for agent loops."""

os.register_at_fork(after_in_child=loop_threads._reset)
