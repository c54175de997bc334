"""The holder's side of forwarding: a message another runtime forwarded here is
taken, delivered to the child's supervisor (steer only) and answered.

A take is durable before the message reaches the run (`persistence.Inbox.take`), and
every message taken here is answered, however long the store takes to come back: its
sender waits for the answer as long as this runtime lives. A steered message is answered
by the transaction of its steering record; anything else (a refusal, a kill) here. A
message notified twice (its sender's post was retried through a failing store) is taken
once. `controlplane.runtime.routing._forwarding` holds the sender's side and the whole protocol.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.contract import ErrorCode, SendResult, SubagentControlError

if TYPE_CHECKING:
    from persistence import Inbox, InboxItem

__all__ = ["InFlight", "KillHere", "Serve", "Serving"]

log = logging.getLogger(__name__)

_RETRY_S = 0.25  # between answers the failing store refused
_CLOSING_ANSWER_S = 2.0
"""How long, once close has begun, an answer the failing store refused is tried again: a
row left ``taken`` unanswered keeps its sender waiting until it sees this runtime closed
(or its own bound, when the close cannot be recorded either), so a blip is ridden
through, but close is not held by an outage."""
_SLOW_S = 1.0
"""A forwarded message served here slower than this (from its notification to its
answer) is logged with where the time went: its sender's bound is `TAKE_S` to be taken,
and a child should be reachable within its lease after a fault heals."""
_DELIVERERS = 64
"""Forwarded messages delivered here at once at most (each waits on its own thread for its
child: its run's publication, its record's write), apart from the workers that take them."""
_REMEMBERED = 4096
"""How many taken messages' ids a runtime remembers (a duplicate notification comes
within moments of the first)."""

Serve = Callable[["InboxItem"], SendResult]
"""Deliver a message taken from the inbox here (steer only); raises the refusal."""
KillHere = Callable[[str, str], bool]
Delivering = Callable[[str, str, dict[str, Any]], AbstractContextManager[None]]
"""Around one forwarded item's delivery (`Telemetry.delivering`): takes its trace context."""
"""Abort a Task of this runtime, given its id and the reason; False if it is not here."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A forwarded message awaiting its answer, for the tree dump."""

    child_id: str
    runtime_id: str
    """The other end: the holder a message was sent to, or the sender of one served here."""
    since: float  # time.monotonic()


class Serving:
    """Takes, delivers and answers the messages forwarded to this runtime.

    Args:
        runtime_id: This runtime's id.
        inbox: The store's inbox.
        workers: Where messages are taken (the listener must never block); they are
            delivered on threads of this object's own, so that a delivery waiting for its
            child never holds up the take of a message to another.
        serve: Delivers a message forwarded here to the child's supervisor, steer only.
        kill_here: Kills a Task of this runtime whose kill was forwarded here.
    """

    def __init__(
        self,
        runtime_id: str,
        inbox: Inbox,
        workers: ThreadPoolExecutor,
        serve: Serve,
        kill_here: KillHere,
        delivering: Delivering | None = None,
    ) -> None:
        self._runtime_id = runtime_id
        self._delivering = delivering
        self._inbox = inbox
        self._workers = workers
        self._serve = serve
        self._kill_here = kill_here
        self._lock = threading.Lock()
        self._serving: dict[str, InFlight] = {}  # inbox id -> where it came from
        self._taken: OrderedDict[str, None] = OrderedDict()  # taken here, newest last
        self._closing = threading.Event()  # answers still owed stop waiting for the store
        self._deliverers = ThreadPoolExecutor(_DELIVERERS, thread_name_prefix="subagent-delivering")

    def closing(self) -> None:
        """Close has begun: an answer the store refuses is tried again for
        `_CLOSING_ANSWER_S` at most (then its sender decides from the transcript once this
        runtime is closed)."""
        self._closing.set()

    def close(self) -> None:
        """Wait for the messages taken here to be delivered and answered (call it once
        nothing takes any more: the workers that take them have shut down)."""
        self._deliverers.shutdown(wait=True)

    def in_flight(self) -> dict[str, InFlight]:
        """The messages being served here, by inbox id."""
        with self._lock:
            return dict(self._serving)

    def on_message(self, inbox_id: str, carried: InboxItem | None) -> None:
        # On a worker: taking and delivering wait for the database and the supervisor,
        # and the listener must keep hearing answers meanwhile.
        with contextlib.suppress(RuntimeError):  # closing: its sender takes it back
            self._workers.submit(self._take, inbox_id, carried, time.monotonic())

    def _take(self, inbox_id: str, carried: InboxItem | None, heard: float | None = None) -> None:
        """Take a message notified at ``heard`` (`time.monotonic`) and hand it over to be
        delivered."""
        with self._lock:
            if inbox_id in self._taken:
                return  # notified again (its sender's post was retried): taken once here
            self._taken[inbox_id] = None
            while len(self._taken) > _REMEMBERED:
                self._taken.popitem(last=False)
        began = time.monotonic()
        heard = began if heard is None else heard
        try:
            item = self._inbox.take(inbox_id, self._runtime_id, carried)
        except SubagentControlError as exc:
            # Perhaps taken all the same (its acknowledgement lost with the server): its
            # sender would wait for an answer as long as this runtime lives. Never
            # delivered here, so that is the answer (a row never taken takes none).
            log.warning("forwarded message %s: not taken (%s)", inbox_id, exc.message)
            why = f"runtime {self._runtime_id} could not take it ({exc.message})"
            self._answer(inbox_id, _refusal(ErrorCode.NOT_DELIVERED, why))
            return
        except Exception as exc:  # a bug, perhaps after the take committed
            # Taken or not, never delivered: answered at once, so that a row the take left
            # ``taken`` does not keep its sender waiting to its bound (an untaken one the
            # answer leaves as it is, and its sender takes it back).
            log.exception("forwarded message %s: taking it failed", inbox_id)
            why = f"runtime {self._runtime_id} failed to take it ({type(exc).__name__})"
            self._answer(inbox_id, _refusal(ErrorCode.NOT_DELIVERED, why))
            return
        if item is None:
            # Its sender gave up on it first: never delivered. The row that refused this
            # take, the only one there is, is clutter now, whether or not its sender lives
            # to forget it.
            self._forget(inbox_id)
            return
        taken = time.monotonic()
        try:
            # Delivered apart from the takes: a delivery waits for its child (the run's
            # publication, its record's write), and a take queued behind such waits
            # missed its sender's bound to be taken (`TAKE_S`) on a loaded holder.
            self._deliverers.submit(self._serve_taken, inbox_id, item, heard, began, taken)
        except RuntimeError:  # shut down (closing): served here, it is taken already
            self._serve_taken(inbox_id, item, heard, began, taken)

    def _serve_taken(
        self, inbox_id: str, item: InboxItem, heard: float, began: float, taken: float
    ) -> None:
        """Deliver a message taken here and answer it (a steer is answered by its record)."""
        flight = InFlight(item.child_id, item.sender_runtime, time.monotonic())
        with self._lock:
            self._serving[inbox_id] = flight
        reply: dict[str, Any] = {}
        try:
            with (  # continues the sender's trace
                self._delivering(item.kind, item.child_id, item.source)
                if self._delivering is not None
                else contextlib.nullcontext()
            ):
                reply = self._deliver(item)
            # `steered` only ever comes back once the steering record is written, and
            # that transaction answered it (`persistence.SqlStore.append`).
            if reply.get("route") != "steered":
                self._answer(inbox_id, reply)
        except Exception:  # unanswered, its sender decides from the transcript
            log.exception("forwarded message %s: serving it failed", inbox_id)
        finally:
            with self._lock:
                self._serving.pop(inbox_id, None)
        done = time.monotonic()
        if done - heard > _SLOW_S:
            log.warning(
                "forwarded message %s to child %s: served in %.2fs (waited %.2fs to be "
                "taken, taken in %.2fs, waited %.2fs to be delivered, %s in %.2fs)",
                inbox_id, item.child_id, done - heard, began - heard, taken - began,
                flight.since - taken,
                reply.get("route") or reply.get("code") or "unanswered", done - flight.since,
            )  # fmt: skip

    def _forget(self, inbox_id: str) -> None:
        try:
            self._inbox.forget([inbox_id])
        except SubagentControlError as exc:  # a leftover row harms nothing
            log.warning("forwarded message %s: not forgotten (%s)", inbox_id, exc.message)

    def _answer(self, inbox_id: str, reply: dict[str, Any]) -> None:
        """Answer a message taken here, however long the store takes to come back: its
        sender waits for the answer as long as this runtime lives. Once close has begun,
        for `_CLOSING_ANSWER_S` more at most (once this runtime has closed, the sender
        decides from the transcript)."""
        give_up_at: float | None = None
        while True:
            try:
                if not self._inbox.answer(inbox_id, reply):
                    log.warning("forwarded message %s: its sender left, or it was answered "
                                "with its steering record first", inbox_id)  # fmt: skip
                return
            except SubagentControlError as exc:
                if self._closing.is_set() and give_up_at is None:
                    give_up_at = time.monotonic() + _CLOSING_ANSWER_S
                if exc.code is not ErrorCode.STORE_UNAVAILABLE or (
                    give_up_at is not None and time.monotonic() >= give_up_at
                ):
                    log.warning("forwarded message %s: unanswered (%s)", inbox_id, exc.message)
                    return
                pause = threading.Event()  # never set: the pace of the retries, bounded
                pause.wait(_RETRY_S)

    def _deliver(self, item: InboxItem) -> dict[str, Any]:
        if item.kind == "kill":
            task_id = str(item.source.get("task_id"))
            self._kill_here(task_id, str(item.source.get("reason")))
            # Not running here any more: it settled meanwhile, so there is nothing to kill.
            return {"route": "killed", "task_id": task_id}
        try:
            sent = self._serve(item)
        except SubagentControlError as exc:
            if _fenced_unwritten(exc):
                # This runtime fenced the activation before the record was written: it
                # never will be (and one still on its way lands only on a row still
                # ``taken``, `persistence.Inbox.answer_steered`), so the message was not
                # delivered, whatever the aborted run held. Its sender may retry it.
                why = f"runtime {self._runtime_id} lost its lease before recording it"
                return _refusal(ErrorCode.NOT_DELIVERED, f"{why} ({exc.message})")
            refusal: dict[str, Any] = {
                "code": exc.code.value, "message": exc.message, "task_id": exc.task_id
            }  # fmt: skip
            if exc.code is ErrorCode.NOT_DELIVERED and not self._holds(item.child_id):
                refusal["elsewhere"] = True  # not ours (any more): its sender routes it again
            return refusal
        except Exception as exc:
            return _refusal(ErrorCode.INTERNAL, f"internal error ({exc})")
        return {"route": sent.route, "task_id": sent.task_id}

    def _holds(self, child_id: str) -> bool:
        """Whether this runtime holds the child's claim (yes while the store cannot say:
        the refusal then stands, not delivered, and is not routed again)."""
        try:
            return self._inbox.holder_of(child_id) == self._runtime_id
        except SubagentControlError:
            return True


def _fenced_unwritten(exc: SubagentControlError) -> bool:
    """Whether a steer's record failed because this runtime fenced its activation
    (`actors.Transcript`: ``DURABILITY_FAILED`` caused by ``FENCED``)."""
    cause = exc.__cause__
    return (
        exc.code is ErrorCode.DURABILITY_FAILED
        and isinstance(cause, SubagentControlError)
        and cause.code is ErrorCode.FENCED
    )


def _refusal(code: ErrorCode, why: str) -> dict[str, Any]:
    """A holder's answer that it did not deliver a message."""
    return {"code": code.value, "message": f"{why}; the message was not delivered",
            "task_id": None}  # fmt: skip
