"""Reused threads for actors' loops: an activation starts on an idle worker, not a new thread.

Starting a thread costs a few hundred microseconds on these machines (the starter waits
until the new thread runs); handing a loop to a worker that waits for one costs one wake-up.
A resume starts an activation actor every time, so its latency pays the difference.

Only the thread is shared. The loop a worker runs is pykka's own `_actor_loop`, untouched,
so every stop and error rule of pykka holds as on a thread of its own: an ``Exception`` in
a handler goes to the asker or ``on_failure``; a ``BaseException`` stops every actor; a
stop answers what is queued behind it with `pykka.ActorDeadError`; a ``tell`` that races a
stop is dropped. What a new thread would start with, each loop starts with too: an empty
`contextvars.Context` and the `threading` module's trace and profile hooks. A loop that
lets an exception escape (pykka lets a ``BaseException`` from ``on_start`` through) ends its
worker the way it would end its own thread, through `threading.excepthook`; the worker is
never reused.

A worker is a daemon thread or not as the actor it runs asks (`use_daemon_thread`): there
is a pool of each. An idle worker never keeps the process alive: a non-daemon one ends when
the interpreter starts to exit, before it waits for the non-daemon threads (as
`concurrent.futures` workers do), so the process still waits exactly for the non-daemon
actors that were not stopped, as pykka's own threads make it. At most `LoopPool.max_idle`
workers wait, each for `LoopPool.idle_s` seconds; a job goes to the one that went idle last.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LoopPool", "actor_threads", "non_daemon_actor_threads", "pool_for"]


@dataclass(frozen=True, slots=True)
class _Job:
    loop: Callable[[], None]
    name: str


class _Waiting:
    """One idle worker's hand-off: ``job`` is set, then ``wake`` released, by whoever
    takes the worker off the pool's stack (a submitter, or a drain with None)."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: _Job | None = None


_IDLE_NAME = "actor-pool-idle"


class LoopPool:
    """Worker threads (all daemon, or none), each running one actor loop at a time.

    Idle workers wait on a stack: a job goes to the one that went idle last, whose CPU is
    the likeliest to be awake still (on a VM guest a halted vCPU takes several times longer
    to wake than one that still polls), and the others stay asleep until they time out.

    Invariant, under ``_lock``: ``_waiting`` holds exactly the workers that wait for a job
    and have not been handed one; a worker taken off it is always handed a job (or None).
    """

    def __init__(self, *, daemon: bool = True, max_idle: int = 16, idle_s: float = 30.0) -> None:
        self.daemon = daemon
        self.max_idle = max_idle
        """How many workers may wait for a job at once; a worker freed beyond it ends."""
        self.idle_s = idle_s
        """How long a worker waits for a job before it ends."""
        self._reset()
        if not daemon:
            # Run by `threading._shutdown` before it joins the non-daemon threads.
            threading._register_atexit(self._exiting)  # type: ignore[attr-defined]

    def _reset(self) -> None:
        # Also the state of a forked child, where none of the parent's workers exists.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._watchers = 0  # threads in `wait_idle`: only they need a notify
        self._waiting: list[_Waiting] = []
        self._serial = itertools.count()
        self._exited = False

    def _exiting(self) -> None:
        """The interpreter exits: idle workers end now, busy ones once their loop ends."""
        with self._lock:
            self._exited = True
        self.drain()

    def run(self, loop: Callable[[], None], name: str) -> None:
        """Run ``loop`` on an idle worker, or on a new worker thread named ``name-N``.

        Raises:
            RuntimeError: The new thread could not start (no idle worker, and the
                process is at its thread limit); ``loop`` will never run.
        """
        job = _Job(loop, f"{name}-{next(self._serial)}")
        with self._lock:
            if self._waiting:
                waiting = self._waiting.pop()
                waiting.job = job
                waiting.wake.release()
                return
        # Handed over in a list the worker empties: the thread keeps its ``args`` for as
        # long as it runs, and a job there would keep its finished actor alive with it.
        first = [job]
        del job
        thread = threading.Thread(
            target=self._work, args=(first,), name=first[0].name, daemon=self.daemon
        )
        thread.start()

    def idle(self) -> int:
        """How many workers wait for a job right now."""
        with self._lock:
            return len(self._waiting)

    def wait_idle(self, count: int, timeout_s: float) -> bool:
        """Block until at least ``count`` workers wait for a job; whether they did within
        ``timeout_s`` (a test's sync point: a loop's worker is freed after its actor
        stopped)."""
        with self._changed:
            self._watchers += 1
            try:
                return self._changed.wait_for(lambda: len(self._waiting) >= count, timeout_s)
            finally:
                self._watchers -= 1

    def drain(self) -> None:
        """End every idle worker (the next `run` starts a thread)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            for one in waiting:
                one.wake.release()  # its job stays None: it ends

    # -- a worker ---------------------------------------------------------------------

    def _work(self, first: list[_Job]) -> None:
        thread = threading.current_thread()
        job: _Job | None = first.pop()
        waiting = _Waiting()
        while job is not None:
            thread.name = job.name
            # What a new thread starts with: the module's hooks and an empty context.
            sys.settrace(threading.gettrace())
            sys.setprofile(threading.getprofile())
            contextvars.Context().run(job.loop)
            del job  # nothing of the finished actor stays reachable from an idle worker
            thread.name = _IDLE_NAME
            job = self._next(waiting)

    def _next(self, waiting: _Waiting) -> _Job | None:
        """The next job for this worker, or None: it ends."""
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


actor_threads = LoopPool()
"""The process's daemon workers, for pooled daemon actors' loops."""
non_daemon_actor_threads = LoopPool(daemon=False)
"""The process's non-daemon workers, for pooled non-daemon actors' loops."""

os.register_at_fork(after_in_child=actor_threads._reset)
os.register_at_fork(after_in_child=non_daemon_actor_threads._reset)


def pool_for(*, daemon: bool) -> LoopPool:
    """The process's pool of daemon or of non-daemon workers."""
    return actor_threads if daemon else non_daemon_actor_threads
