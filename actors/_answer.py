"""Waiting for an actor's answer for as long as the actor lives."""

from __future__ import annotations

from typing import Any, Final

import pykka

__all__ = ["NO_ANSWER", "answer_of"]

NO_ANSWER: Final = object()
"""What `answer_of` returns when the actor stopped without handling the message."""

_LIVENESS_POLL_S: Final = 1.0


def answer_of(
    actor: pykka.ActorRef[Any], future: pykka.Future[Any], *, poll_s: float = _LIVENESS_POLL_S
) -> Any:
    """The answer to an ask of ``actor``, or `NO_ANSWER` if it stopped without one.

    No deadline while the actor lives: a caller that gave up on a slow answer could not
    tell the message's sender whether it was handled. pykka answers a handled message
    before the actor stops, and silently drops a message that raced the stop; so a
    stopped actor with no answer never handled it.
    """
    while True:
        try:
            return future.get(timeout=poll_s)
        except pykka.Timeout:
            if actor.is_alive():
                continue
            try:
                return future.get(timeout=0)
            except pykka.Timeout:
                return NO_ANSWER
        except pykka.ActorDeadError:
            return NO_ANSWER
