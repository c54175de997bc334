"""Waiting for an actor's answer: no deadline while it lives, and a stopped actor that
never handled the message is told apart from one that did — at once, with no polling."""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest
from pykka._envelope import Envelope

from actors._answer import NO_ANSWER, answer_of
from actors._base import Actor, Reply
from tests.support import WAIT_S


class Gated(Actor):
    """Answers "done" once its gate opens."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def on_receive(self, message: Any) -> Any:
        assert self.gate.wait(WAIT_S)
        return "done"


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


def test_a_slow_answer_is_waited_for_past_many_polls(gate: threading.Event) -> None:
    actor = Gated.start(gate)
    try:
        future = actor.ask("work", block=False)
        polls = threading.Timer(0.2, gate.set)  # 20 polls of 10 ms go by first
        polls.start()
        assert answer_of(future) == "done"
    finally:
        actor.stop()


def test_a_message_queued_behind_a_stop_has_no_answer(gate: threading.Event) -> None:
    actor = Gated.start(gate)
    working = actor.ask("work", block=False)
    stopped = actor.stop(block=False)
    dropped = actor.ask("work", block=False)  # behind the stop: never handled
    gate.set()

    assert answer_of(working) == "done"
    stopped.get(timeout=WAIT_S)
    assert answer_of(dropped) is NO_ANSWER


def test_a_message_to_an_actor_that_is_gone_has_no_answer(gate: threading.Event) -> None:
    actor = Gated.start(gate)
    actor.stop()

    assert answer_of(actor.ask("work", block=False)) is NO_ANSWER


def test_an_ask_that_races_the_stop_is_answered_not_handled_at_once(
    gate: threading.Event,
) -> None:
    actor = Gated.start(gate)
    gate.set()
    actor.stop()
    # What a racing ask does: it saw the actor alive, then put its envelope after the
    # loop's last drain. Nobody will read it, and it says so at once.
    late: pykka.Future[Any] = Reply()
    actor.actor_inbox.put(Envelope("work", reply_to=late))

    with pytest.raises(pykka.ActorDeadError):
        late.get(timeout=0)
    assert answer_of(late) is NO_ANSWER
