"""What became of a message this runtime forwarded: the sender's wait for the holder's
answer, and its truth-finding when the holder died or the store failed meanwhile (the
protocol: `controlplane.runtime.routing._forwarding`'s docstring). Apart from the forwarder's
bookkeeping (what is in flight, which runtime holds which child, the rows left to forget), because
this is where the exactly-once-or-told promise is decided, and it reads best on its own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from controlplane.contract import ErrorCode, EventKind, SendResult, SubagentControlError

if TYPE_CHECKING:
    from controlplane.runtime.lease._runtime import Runtime
    from persistence import Inbox, InboxItem, SqlStore

__all__ = ["TAKE_S", "AnswerFinder", "Heard", "Posted", "answer_of"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

TAKE_S = 3.0
"""How long a forwarded message waits for its target to take it before it is taken back."""
_POLL_S = 0.25  # a lapsed target is seen this long after its lease at most (~3 reads)
_FIRST_POLL_S = 0.05  # a healthy forward is answered well before; a dead target is seen soon
_NOTIFY_AGAIN_S = 0.5
"""A message not taken this long after its last notification is notified again: its
target's listener may have been between two connections (it listens again 0.5 s after
its connection drops)."""


@dataclass(slots=True)
class Posted:
    """A message posted to its holder, as the wait for its answer sees it."""

    woken: threading.Event
    written: bool = False
    """Whether the message went as a row (too long for a notification)."""
    unsent: SubagentControlError | None = None
    """Why posting it failed: it may still have gone out (a commit whose acknowledgement
    was lost), so it is taken back, or found taken, before anything is reported."""


Heard = Callable[[str], dict[str, Any] | None]
"""Takes the answer to a message heard in a notification (the forwarder's listener), if any."""


class AnswerFinder:
    """The sender's end of a forward once the message is posted: waits for the holder's
    answer (`outcome`) and, when the holder died with it, decides from the transcript
    whether it was delivered (`decide_without`).

    Args:
        runtime: This runtime (whether the holder is dead; the sweep that fences it off).
        store: The shared store (its inbox, transcripts and Task rows).
        heard: The answers heard in notifications (the forwarder's).
    """

    def __init__(self, runtime: Runtime, store: SqlStore, heard: Heard) -> None:
        assert store.inbox is not None
        self._runtime = runtime
        self._store = store
        self._inbox: Inbox = store.inbox
        self._heard = heard

    def outcome(self, item: InboxItem, holder: str, posted: Posted) -> dict[str, Any] | None:
        """The holder's answer; None if it died with the message untaken or unanswered
        (then it can no longer take or answer it: its late answer is dropped).

        A store that fails meanwhile (a restart, a failover) is asked again: a read that
        failed says nothing about the message, so it is never reported as its failure.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if it did not take it in time (or
                ``STORE_UNAVAILABLE`` if posting it failed and it was taken back: never
                delivered either); ``DURABILITY_FAILED`` if the store stayed unreachable
                past the forwarding deadline plus its retry budget, so that nobody can
                tell whether the holder took it, or if the holder took it and has not
                answered for as long (it may be in the child's transcript).
        """
        inbox_id, child_id, woken = item.inbox_id, item.child_id, posted.woken
        now = time.monotonic()
        # Posting failed: it may have gone out all the same, so take it back at once.
        take_by = now if posted.unsent is not None else now + TAKE_S
        ask = _Asking(child_id, holder, now + TAKE_S + self._store.retry_budget_s)
        notify_at, written = now + _NOTIFY_AGAIN_S, posted.written
        # Taken, a live holder answers within its own store's retries: past that, its
        # delivery hangs (it took the message in the gap between fencing and re-arming,
        # or its run never came back), and the sender is told, not kept waiting.
        taken_at: float | None = None
        answer_within = TAKE_S + self._store.retry_budget_s
        poll_s = _FIRST_POLL_S
        while True:
            woken.wait(max(0.0, min(poll_s, take_by - time.monotonic())))
            woken.clear()
            poll_s = min(_POLL_S, poll_s * 2)
            heard = self._heard(inbox_id)
            if heard is not None:
                return heard
            read = ask(lambda: self._inbox.state_of(inbox_id))
            if read is None:
                continue  # the store failed: nothing learnt, ask again
            state, reply = read
            if state is None and not posted.written:
                state = "pending"  # only its notification carries it: not taken yet
            if state == "answered" and reply is not None:
                return reply
            if state is None or state == "abandoned":  # never so while we wait; be safe
                return None
            if state == "pending":
                late = time.monotonic() >= take_by
                if not late and not ask(lambda: self._runtime.is_dead_id(holder)):
                    if time.monotonic() >= notify_at:  # its listener may have missed it
                        ask(lambda: self._inbox.notify_again(item, target=holder, written=written))
                        notify_at = time.monotonic() + _NOTIFY_AGAIN_S
                    continue
                if not ask(lambda: self._inbox.take_back(item, target=holder)):
                    continue  # taken at the last moment (or unknown): wait for its answer
                if posted.unsent is not None:
                    raise posted.unsent  # taken back: it never went anywhere
                if late:
                    raise _not_delivered(
                        child_id, f"runtime {holder} did not take it within {TAKE_S:g} s"
                    )
                return None  # it died first: never delivered
            if state == "taken" and ask(lambda: self._runtime.is_dead_id(holder)) is not True:
                now = time.monotonic()
                taken_at = now if taken_at is None else taken_at
                if now >= taken_at + answer_within:
                    raise _unanswered(child_id, holder, answer_within)
                take_by = now + _POLL_S  # only the poll bounds the wait now
                continue
            if ask(lambda: self._inbox.abandon(inbox_id, state="taken")):
                return None
            # It answered at the last moment: read it on the next round.

    def decide_without(self, inbox_id: str, child_id: str, holder: str) -> SendResult | None:
        """The holder died with the message: whether it was delivered is in the
        transcript, once the holder can no longer write to it. None: it was not."""
        give_up_at = time.monotonic() + self._store.retry_budget_s
        ask = _Asking(child_id, holder, give_up_at)
        pause = threading.Event()  # never set: a bounded pause between failed rounds
        # Its Tasks interrupted, its claims gone: only then can it write no more. The sweep
        # judges the holder again and may spare it (this runtime's own renewals broke
        # meanwhile, in a store outage); the transcript read before it is fenced could miss
        # a record it commits after, and a delivered message be reported not delivered.
        while ask(self._runtime.sweep) is None or ask(lambda: self._holds(holder, child_id)) in (
            None,
            True,
        ):
            if time.monotonic() >= give_up_at:
                raise _unconfirmed(child_id, holder, _not_fenced(holder))
            pause.wait(_POLL_S)
        while (loaded := ask(lambda: self._store.load(child_id))) is None:
            pause.wait(_POLL_S)
        task_of_turn: dict[int, str] = {}
        for event in loaded.events:
            if event.kind == EventKind.TURN_START and isinstance(event.data, dict):
                task_of_turn[event.turn] = str(event.data.get("task_id"))
            if (
                event.kind == EventKind.STEERING_MESSAGE
                and isinstance(event.data, dict)
                and event.data.get("forwarded") == inbox_id
                and event.turn in task_of_turn
            ):
                return SendResult(route="steered", task_id=task_of_turn[event.turn])
        log.info("forwarded message %s: runtime %s ended before it delivered it", inbox_id, holder)
        return None

    def _holds(self, holder: str, child_id: str) -> bool:
        """Whether ``holder`` still has a running Task of ``child_id`` in the store (and so
        its claim: it could still write)."""
        return any(t.child_id == child_id for t in self._store.ledger.running([holder]))


def answer_of(reply: dict[str, Any], child_id: str, holder: str) -> SendResult | None:
    if "route" in reply:
        return SendResult(route=reply["route"], task_id=reply["task_id"])
    if reply.get("elsewhere"):
        log.info("child %s: runtime %s no longer runs it; routing the message again",
                 child_id, holder)  # fmt: skip
        return None
    raise SubagentControlError(
        ErrorCode(reply["code"]),
        f"{reply['message']} (answered by runtime {holder}, which runs the child)",
        child_id=child_id,
        task_id=reply.get("task_id"),
    )


def _not_delivered(child_id: str, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id} runs in another runtime and {why}; the message was not "
        "delivered; retry it",
        child_id=child_id,
    )


class _Asking:
    """A sender's store calls once its message is posted: a call the store fails
    (``STORE_UNAVAILABLE`` after its own retries) answers None — nothing learnt, ask
    again — until ``give_up_at``, then raises `_unconfirmed`: whether the message was
    delivered is unknown, and it is never reported as not delivered."""

    __slots__ = ("_child_id", "_give_up_at", "_holder")

    def __init__(self, child_id: str, holder: str, give_up_at: float) -> None:
        self._child_id = child_id
        self._holder = holder
        self._give_up_at = give_up_at

    def __call__(self, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                raise
            if time.monotonic() >= self._give_up_at:
                raise _unconfirmed(self._child_id, self._holder, exc) from exc
            log.warning("child %s: a message forwarded to runtime %s awaits its outcome; "
                        "the store failed (%s), asking again", self._child_id, self._holder,
                        exc.message)  # fmt: skip
            return None


def _unanswered(child_id: str, holder: str, within_s: float) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.DURABILITY_FAILED,
        f"child {child_id} runs in runtime {holder}, which took the message but did not "
        f"answer within {within_s:g} s; it may be in the child's transcript: look there "
        "before sending it again",
        child_id=child_id,
    )


def _not_fenced(holder: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.STORE_UNAVAILABLE,
        f"runtime {holder} seemed dead but could not be fenced off in time",
    )


def _unconfirmed(child_id: str, holder: str, exc: SubagentControlError) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.DURABILITY_FAILED,
        f"child {child_id} runs in runtime {holder}, which may have taken the message, but "
        f"the store could not confirm it ({exc.message}); it may be in the child's "
        "transcript: look there before sending it again",
        child_id=child_id,
    )
