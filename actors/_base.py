"""The base of every actor here: pykka's `ThreadingActor`, minus one leak.

`pykka.Actor.start` registers the actor *before* it starts the actor's thread. When the
thread cannot start (``RuntimeError: can't start new thread`` at the process's thread
ceiling), the registry keeps a ref whose actor never runs: `pykka.ActorRegistry.stop_all`
then waits for it forever, and a `tell` to it is queued into the void.
"""

from __future__ import annotations

import pykka

__all__ = ["Actor"]


class Actor(pykka.ThreadingActor):
    """A `pykka.ThreadingActor` that leaves nothing behind when its thread cannot start."""

    def _start_actor_loop(self) -> None:
        try:
            super()._start_actor_loop()
        except BaseException:
            # Re-raised as is (KeyboardInterrupt included): only the registration and the
            # "alive" state are undone, so the failed start is what the caller sees.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            raise
