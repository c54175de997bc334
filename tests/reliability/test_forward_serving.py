"""The holder's side of forwarding (`controlplane.runtime.routing._forward_serving`): a
message taken here that cannot be delivered is answered ``NOT_DELIVERED`` at once, never
left ``taken`` and unanswered for its sender to wait out its bound (issue 36 break 5); a
message is taken while the deliveries of as many others as there are workers wait for
their child.

Driven against an inbox of the test's own that keeps its rows in memory, so each path (a
take that raises after it committed, an answer the store refuses while closing) is made
exactly, with no database.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controlplane import ErrorCode, SendResult, SubagentControlError
from controlplane.runtime.routing._forward_serving import Serving
from persistence import InboxItem
from tests.support import WAIT_S

HOLDER = "holder-runtime"


class MemoryInbox:
    """The few `persistence.Inbox` calls `Serving` makes, on rows held here.

    ``take_raises``: the take marks the row ``taken`` (its commit went through) and then
    raises it, as a bug after the commit would. ``answer_fails``: how many answers fail
    ``STORE_UNAVAILABLE`` before one goes through.
    """

    def __init__(self, *, take_raises: Exception | None = None, answer_fails: int = 0) -> None:
        self.state: dict[str, str] = {}
        self.replies: dict[str, dict[str, Any]] = {}
        self._take_raises = take_raises
        self._answer_fails = answer_fails
        self.answer_calls = 0

    def take(self, inbox_id: str, target: str, carried: InboxItem | None) -> InboxItem | None:
        assert target == HOLDER
        assert carried is not None
        self.state[inbox_id] = "taken"
        if self._take_raises is not None:
            raise self._take_raises
        return carried

    def answer(self, inbox_id: str, reply: dict[str, Any]) -> bool:
        self.answer_calls += 1
        if self._answer_fails > 0:
            self._answer_fails -= 1
            raise SubagentControlError(ErrorCode.STORE_UNAVAILABLE, "the store is down (test)")
        if self.state.get(inbox_id) != "taken":
            return False
        self.state[inbox_id], self.replies[inbox_id] = "answered", reply
        return True

    def holder_of(self, child_id: str) -> str | None:
        return HOLDER

    def forget(self, ids: list[str]) -> None:
        for inbox_id in ids:
            self.state.pop(inbox_id, None)


def _item() -> InboxItem:
    return InboxItem("m-1", "send", "child-1", "sender-runtime", "p", [], {"kind": "coordinator"})


def _serving(inbox: MemoryInbox, serve: Any) -> tuple[Serving, ThreadPoolExecutor]:
    workers = ThreadPoolExecutor(2)
    serving = Serving(HOLDER, inbox, workers, serve, lambda _task, _why: False)  # type: ignore[arg-type]
    return serving, workers


def _never_served(item: InboxItem) -> SendResult:
    raise AssertionError(f"{item.inbox_id} was served")


def test_a_take_that_raises_after_it_committed_is_answered_not_delivered_at_once() -> None:
    # A bug in the take after its commit (here: any exception that is no store error) left
    # the row `taken` and unanswered: its sender waited the forward's whole bound (3 s plus
    # the store's retry budget) and then heard DURABILITY_FAILED for a message that was
    # never delivered.
    inbox = MemoryInbox(take_raises=RuntimeError("a bug after the commit (test)"))
    serving, workers = _serving(inbox, _never_served)
    try:
        serving._take("m-1", _item())
    finally:
        workers.shutdown(wait=True)
    assert inbox.state["m-1"] == "answered"
    reply = inbox.replies["m-1"]
    assert reply["code"] == ErrorCode.NOT_DELIVERED.value
    assert "not delivered" in reply["message"]


def test_an_answer_the_store_refuses_once_close_has_begun_is_tried_again() -> None:
    # Once close had begun, an answer the failing store refused was given up at once: the
    # row stayed `taken` and its sender waited until it saw this runtime closed (or, with
    # the close unrecorded in the same outage, its own bound).
    inbox = MemoryInbox(answer_fails=2)
    refusing = threading.Event()

    def serve(item: InboxItem) -> SendResult:
        refusing.set()
        raise SubagentControlError(ErrorCode.CLOSED, "closing (test)", child_id=item.child_id)

    serving, workers = _serving(inbox, serve)
    try:
        serving.closing()
        serving._take("m-1", _item())
    finally:
        workers.shutdown(wait=True)
        serving.close()
    assert refusing.is_set()
    assert inbox.answer_calls == 3
    assert inbox.state["m-1"] == "answered"
    assert inbox.replies["m-1"]["code"] == ErrorCode.CLOSED.value


def test_an_answer_the_store_keeps_refusing_once_close_has_begun_is_given_up_in_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Close is not held by an outage: the retries stop at their bound.
    monkeypatch.setattr("controlplane.runtime.routing._forward_serving._CLOSING_ANSWER_S", 0.3)
    inbox = MemoryInbox(answer_fails=10_000)

    def serve(item: InboxItem) -> SendResult:
        raise SubagentControlError(ErrorCode.CLOSED, "closing (test)", child_id=item.child_id)

    serving, workers = _serving(inbox, serve)
    try:
        serving.closing()
        serving._take("m-1", _item())
    finally:
        workers.shutdown(wait=True)
        serving.close()
    assert inbox.state["m-1"] == "taken"
    assert 2 <= inbox.answer_calls <= 4


def test_a_message_is_taken_and_delivered_while_every_worker_would_be_waiting_for_its_child(
) -> None:  # fmt: skip
    # A holder's workers took each forwarded message and then delivered it, waiting for
    # its child (the run's publication, the record's write). On a loaded holder as many
    # deliveries as workers waited at once and the next message's take queued behind
    # them: its sender's bound to have it taken (3 s) passed, `NOT_DELIVERED` (a kernel
    # stress run: a holder took messages 1-2.5 s after they were heard, children were
    # reached 5.2-6.7 s after a heal, bound 5 s).
    from controlplane.runtime.routing._forwarding import _WORKERS

    inbox = MemoryInbox()
    release = threading.Event()
    delivered: list[str] = []
    quick_delivered = threading.Event()

    def serve(item: InboxItem) -> SendResult:
        if item.child_id == "slow-child":
            assert release.wait(3 * WAIT_S)  # its run not yet published, say
        delivered.append(item.inbox_id)
        if item.inbox_id == "quick":
            quick_delivered.set()
        return SendResult(route="steered", task_id="task-1")

    workers = ThreadPoolExecutor(_WORKERS)  # as many as a runtime's forwarder has
    serving = Serving(HOLDER, inbox, workers, serve, lambda _task, _why: False)  # type: ignore[arg-type]
    try:
        for n in range(_WORKERS):
            item = InboxItem(f"slow-{n}", "send", "slow-child", "s", "p", [], {"kind": "human"})
            serving.on_message(item.inbox_id, item)
        quick = InboxItem("quick", "send", "other-child", "s", "p", [], {"kind": "human"})
        serving.on_message("quick", quick)
        # Before: still queued for a worker (every one waiting for the slow child).
        assert quick_delivered.wait(WAIT_S)
        assert inbox.state["quick"] == "taken"  # a steer is answered by its record
        assert all(inbox.state[f"slow-{n}"] == "taken" for n in range(_WORKERS))
    finally:
        release.set()
        workers.shutdown(wait=True)
        close = getattr(serving, "close", None)
        if close is not None:
            close()
    assert len(delivered) == _WORKERS + 1
