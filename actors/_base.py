"""The base of every actor here: pykka's `ThreadingActor`, minus one leak, on a lighter
inbox.

`pykka.Actor.start` registers the actor *before* it starts the actor's thread. When the
thread cannot start (``RuntimeError: can't start new thread`` at the process's thread
ceiling), the registry keeps a ref whose actor never runs: `pykka.ActorRegistry.stop_all`
then waits for it forever, and a `tell` to it is queued into the void.

The inbox is a `queue.SimpleQueue` rather than pykka's `queue.Queue`: the same FIFO
(``put``, ``get``, ``empty`` are all pykka asks of an inbox), written in C, without the
three `threading.Condition` objects (~3 KiB) a `queue.Queue` carries and the Python-level
locking each message pays through them. A live child has two actors, so this is memory per
live child and time per steer.

An actor class with `Actor.pooled_loop` runs its loop on a reused worker thread
(`actors._pool`) instead of a new one: the same pykka loop, minus a thread start.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, ClassVar

import pykka

from actors._pool import pool_for

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope

__all__ = ["Actor"]


class Actor(pykka.ThreadingActor):
    """A `pykka.ThreadingActor` that leaves nothing behind when its thread cannot start."""

    pooled_loop: ClassVar[bool] = False
    """Run the loop on an idle worker of `actors._pool` (daemon or not, as
    ``use_daemon_thread`` says), or on a new worker thread if none waits."""

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        inbox: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        return inbox

    def _start_actor_loop(self) -> None:
        try:
            if self.pooled_loop:
                pool_for(daemon=self.use_daemon_thread).run(self._actor_loop, type(self).__name__)
            else:
                super()._start_actor_loop()
        except BaseException:
            # Re-raised as is (KeyboardInterrupt included): only the registration and the
            # "alive" state are undone, so the failed start is what the caller sees.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            raise
