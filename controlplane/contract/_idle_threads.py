"""Reused threads for loops: a loop starts on a thread that waits for one, not a new thread.

Starting a thread costs a few hundred microseconds on these machines (the starter waits
until the new thread runs); handing a loop to a thread that waits for one costs one
wake-up. The actor runtime (`actors`) runs its actors' loops this way, the providers their
agent loops; both build on `IdleThreads`, which lives here because the providers may import
nothing but the contract.

While it runs a loop a thread bears the name it was given; idle, it bears the pool's idle
name. Each loop starts with what a new thread would: an empty `contextvars.Context` and the
`threading` module's trace and profile hooks. A loop that lets an exception escape ends its
thread the way it would end a thread of its own, through `threading.excepthook`; that thread
is never reused. Nothing of a finished loop stays reachable from an idle thread.

Idle threads wait on a stack: a loop goes to the one that went idle last, whose CPU is the
likeliest to be awake still (on a VM guest a halted vCPU takes several times longer to wake
than one that still polls), and the others stay asleep until they time out. At most
``max_idle`` threads wait, each for ``idle_s`` seconds.

A pool's threads are all daemon threads or none. An idle thread never keeps the process
alive: a non-daemon one ends when the interpreter starts to exit, before it waits for the
non-daemon threads (as `concurrent.futures` workers do), so the process still waits exactly
for the non-daemon loops that run. A forked child has none of its parent's threads: whoever
owns a pool registers its ``_reset`` with `os.register_at_fork`.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable

__all__ = ["IdleThreads"]


class _Job:
    __slots__ = ("loop", "name", "on_return")

    def __init__(
        self, loop: Callable[[], None], name: str, on_return: Callable[[], None] | None
    ) -> None:
        self.loop, self.name, self.on_return = loop, name, on_return


class _Waiting:
    """One idle thread's hand-off: ``job`` is set, then ``wake`` released, by whoever takes
    it off the pool's stack (a starter, or a drain with None)."""

    __slots__ = ("job", "thread", "wake")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: _Job | None = None


class IdleThreads:
    """Threads (all daemon, or none), each running one loop at a time.

    Invariant, under ``_lock``: ``_waiting`` holds exactly the threads that wait for a loop
    and have not been handed one; a thread taken off it is always handed a loop (or None:
    it ends).
    """

    def __init__(self, *, daemon: bool, max_idle: int, idle_s: float, idle_name: str) -> None:
        self.daemon = daemon
        self.max_idle = max_idle
        """How many threads may wait for a loop at once; one freed beyond it ends."""
        self.idle_s = idle_s
        """How long a thread waits for a loop before it ends."""
        self.idle_name = idle_name
        """The name of a thread that runs no loop; no loop's name should start with it."""
        self._reset()
        if not daemon:
            # Run by `threading._shutdown` before it joins the non-daemon threads.
            threading._register_atexit(self._exiting)  # type: ignore[attr-defined]

    def _reset(self) -> None:
        # Also the state of a forked child, where none of the parent's threads exists.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._watchers = 0  # threads in `wait_idle`: only they need a notify
        self._waiting: list[_Waiting] = []
        self._exited = False

    def _exiting(self) -> None:
        """The interpreter exits: idle threads end now, busy ones once their loop ends."""
        with self._lock:
            self._exited = True
        self.drain()

    def launch(
        self, loop: Callable[[], None], name: str, on_return: Callable[[], None] | None = None
    ) -> threading.Thread:
        """Run ``loop`` on an idle thread, or on a new one, named ``name`` while it runs;
        the thread it runs on.

        Args:
            loop: What the thread runs, in an empty context.
            name: The thread's name while ``loop`` runs.
            on_return: Called on the thread once ``loop`` has returned or raised, after the
                thread dropped ``name``. Without it, a loop that raises leaves its name on
                the thread for `threading.excepthook` to report.

        Raises:
            RuntimeError: A new thread could not start (no idle one, and the process is at
                its thread limit); ``loop`` will never run.
        """
        with self._lock:
            if self._waiting:
                waiting = self._waiting.pop()
                waiting.job = _Job(loop, name, on_return)
                waiting.wake.release()
                return waiting.thread
        # Handed over in a list the thread empties: a thread keeps its ``args`` for as long
        # as it runs, and a job there would keep its finished loop alive with it.
        first = [_Job(loop, name, on_return)]
        thread = threading.Thread(target=self._work, args=(first,), name=name, daemon=self.daemon)
        thread.start()
        return thread

    def idle(self) -> int:
        """How many threads wait for a loop right now."""
        with self._lock:
            return len(self._waiting)

    def wait_idle(self, count: int, timeout_s: float) -> bool:
        """Block until at least ``count`` threads wait for a loop; whether they did within
        ``timeout_s`` (a test's sync point: a loop's thread is freed after the loop
        returned)."""
        with self._changed:
            self._watchers += 1
            try:
                return self._changed.wait_for(lambda: len(self._waiting) >= count, timeout_s)
            finally:
                self._watchers -= 1

    def drain(self) -> None:
        """End every idle thread (the next loop starts a new one)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            for one in waiting:
                one.wake.release()  # its job stays None: it ends

    # -- a thread ---------------------------------------------------------------------

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
                if job.on_return is not None:
                    # Renamed before the return is told, raised or not: whoever learns the
                    # loop returned finds its name gone.
                    thread.name = self.idle_name
                    job.on_return()
            del job  # nothing of the finished loop stays reachable from an idle thread
            thread.name = self.idle_name
            job = self._next(waiting)

    def _next(self, waiting: _Waiting) -> _Job | None:
        """The next job for this thread, or None: it ends."""
        with self._lock:
            if self._exited or len(self._waiting) >= self.max_idle:
                return None
            self._waiting.append(waiting)
            if self._watchers:
                self._changed.notify_all()
        if not waiting.wake.acquire(timeout=self.idle_s):
            with self._lock:
                if waiting in self._waiting:  # nobody took it: it ends
                    self._waiting.remove(waiting)
                    return None
            # Taken off the stack as the wait ran out: its job (or None) is on its way.
            waiting.wake.acquire()
        job, waiting.job = waiting.job, None
        return job
