"""Waiting for an actor's answer: no deadline while it lives, and a stopped actor that
never handled the message is told apart from one that did."""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest

from actors._answer import NO_ANSWER, answer_of
from tests.support import WAIT_S


class Gated(pykka.ThreadingActor):
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
        assert answer_of(actor, future, poll_s=0.01) == "done"
    finally:
        actor.stop()


def test_a_message_queued_behind_a_stop_has_no_answer(gate: threading.Event) -> None:
    actor = Gated.start(gate)
    working = actor.ask("work", block=False)
    stopped = actor.stop(block=False)
    dropped = actor.ask("work", block=False)  # behind the stop: never handled
    gate.set()

    assert answer_of(actor, working, poll_s=0.01) == "done"
    stopped.get(timeout=WAIT_S)
    assert answer_of(actor, dropped, poll_s=0.01) is NO_ANSWER


def test_a_message_to_an_actor_that_is_gone_has_no_answer(gate: threading.Event) -> None:
    actor = Gated.start(gate)
    actor.stop()

    assert answer_of(actor, actor.ask("work", block=False), poll_s=0.01) is NO_ANSWER
