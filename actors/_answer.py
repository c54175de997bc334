"""Waiting for an actor's answer for as long as the actor lives."""

from __future__ import annotations

from typing import Any, Final

import pykka

__all__ = ["NO_ANSWER", "answer_of"]

NO_ANSWER: Final = object()
"""What `answer_of` returns when the actor stopped without handling the message."""


def answer_of(future: pykka.Future[Any]) -> Any:
    """The answer to an ask of one of our actors, or `NO_ANSWER` if it never handled it.

    No deadline: a caller that gave up on a slow answer could not tell the message's sender
    whether it was handled. Nor any polling: our actors' inboxes (`actors._base`) answer
    every ask — pykka answers a handled message before the actor stops, and the inbox
    answers `pykka.ActorDeadError` for one still queued when the actor stopped or put after
    it; so that error always means "never handled". A refusal the actor raised is raised
    here.
    """
    try:
        return future.get()
    except pykka.ActorDeadError:
        return NO_ANSWER
