"""Reused threads for actors' loops: an activation starts on an idle worker, not a new thread.

A resume starts an activation actor every time, so its latency pays for a thread start; a
worker that waits for a loop (`controlplane.contract.IdleThreads`, shared with the
providers' agent loops) costs one wake-up instead.

Only the thread is shared. The loop a worker runs is pykka's own `_actor_loop`, untouched,
so every stop and error rule of pykka holds as on a thread of its own: an ``Exception`` in
a handler goes to the asker or ``on_failure``; a ``BaseException`` stops every actor; a
stop answers what is queued behind it with `pykka.ActorDeadError`; a ``tell`` that races a
stop is dropped. A loop that lets an exception escape (pykka lets a ``BaseException`` from
``on_start`` through) ends its worker through `threading.excepthook`, the thread still
named for its actor; the worker is never reused.

A worker is a daemon thread or not as the actor it runs asks (`use_daemon_thread`): there
is a pool of each. An idle worker never keeps the process alive, so the process still waits
exactly for the non-daemon actors that were not stopped, as pykka's own threads make it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from controlplane.contract import IdleThreads

__all__ = ["LoopPool", "actor_threads", "non_daemon_actor_threads", "pool_for"]


class LoopPool(IdleThreads):
    """Worker threads (all daemon, or none), each running one actor loop at a time."""

    def __init__(self, *, daemon: bool = True, max_idle: int = 16, idle_s: float = 30.0) -> None:
        super().__init__(
            daemon=daemon, max_idle=max_idle, idle_s=idle_s, idle_name="actor-pool-idle"
        )
        self._serial = itertools.count()

    def run(self, loop: Callable[[], None], name: str) -> None:
        """Run ``loop`` on an idle worker, or on a new worker thread named ``name-N``.

        Raises:
            RuntimeError: The new thread could not start (no idle worker, and the
                process is at its thread limit); ``loop`` will never run.
        """
        self.launch(loop, f"{name}-{next(self._serial)}")


actor_threads = LoopPool()
"""The process's daemon workers, for pooled daemon actors' loops."""
non_daemon_actor_threads = LoopPool(daemon=False)
"""The process's non-daemon workers, for pooled non-daemon actors' loops."""

os.register_at_fork(after_in_child=actor_threads._reset)
os.register_at_fork(after_in_child=non_daemon_actor_threads._reset)


def pool_for(*, daemon: bool) -> LoopPool:
    """The process's pool of daemon or of non-daemon workers."""
    return actor_threads if daemon else non_daemon_actor_threads
