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
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any

import pykka

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope

__all__ = ["Actor"]


class Actor(pykka.ThreadingActor):
    """A `pykka.ThreadingActor` that leaves nothing behind when its thread cannot start."""

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        inbox: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        return inbox

    def _start_actor_loop(self) -> None:
        try:
            super()._start_actor_loop()
        except BaseException:
            # Re-raised as is (KeyboardInterrupt included): only the registration and the
            # "alive" state are undone, so the failed start is what the caller sees.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            raise
