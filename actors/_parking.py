"""Actors that hold a thread only while their mailbox has messages.

A child's supervisor spends nearly all its life waiting: between turns, and for
``passivate_after_s`` after its last one. pykka's loop waits for the next message on its
inbox, inside the thread that runs it, so every waiting supervisor is a thread (its stack,
its `threading.Thread`): ~90 KiB and a thread each, for nothing.

A `ParkingActor` runs pykka's own loop (``_actor_loop_setup``, ``_actor_loop_running``,
``_actor_loop_teardown``, untouched) on a worker of `actors._pool`, over a `ParkingInbox`
whose ``get`` on an empty mailbox does not wait: it *parks* the actor, raising `_Parked`,
which pykka's loop does not catch (it reads its inbox outside its handler's ``try``). The
loop unwinds to `ParkingActor._run`, which returns the worker to the pool. The next ``put``
finds the actor parked and hands its loop back to a worker (an idle one: one wake-up, as
for an actor on a thread of its own). One step under the inbox's lock decides "empty, so
parked" and "parked, so schedule", so exactly one loop runs per actor at any time and no
message waits in a parked mailbox. A sender that waits for its answer anyway can run a
parked actor's loop on its own thread instead (`ask_here`): then no thread is woken at all.

So every rule of pykka's loop holds: messages one at a time, in order, on one thread at a
time (not always the same thread); ``on_start`` once, before the first message; a stop
answers what is queued behind it; an ``Exception`` in a handler goes to the asker or
``on_failure``. What differs: thread-local state does not survive between messages (a
worker starts each run as a new thread would, with an empty `contextvars.Context`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import pykka
from pykka._envelope import Envelope

from actors._base import Actor, _Inbox, _refuse
from actors._pool import LoopPool, pool_for
from controlplane.contract import ErrorCode, SubagentControlError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pykka._actor import ActorInbox

__all__ = ["HERE_AT_MOST", "ParkingActor", "ParkingInbox", "ask_here"]

log = logging.getLogger(__name__)


class _Parked(BaseException):
    """The mailbox is empty: unwinds pykka's loop back to its worker, which goes free.

    A `BaseException`, so no handler of ours or of pykka's mistakes it for a failure (pykka
    reads the inbox outside the ``try`` around its handler, so it never sees it at all)."""


HERE_AT_MOST = 8
"""How many messages an asker's thread handles when it runs a parked actor's loop: its own,
then those that came behind it while it did, up to this many in all, so senders contending
for one actor are answered without waking a worker, and no asker serves others for long."""


HOT_S = 0.001
"""An actor that parked less than this long ago is hot: `ask_here` hands its message to a
worker, as any other sender's. Senders steering one child at a high rate gain more from the
wake-up's delay (their steers gather, and the activation's inbox commits them together:
about 3 per commit from 4 threads, against 1.5 without it) than from saving the wake-up."""


class ParkingInbox(_Inbox):
    """An actor's mailbox that parks its actor when empty and resumes it on the next put.

    Invariant, under ``_lock``: ``_parked`` is true exactly when no loop runs for the actor
    (then the queue is empty, or the put that will schedule the loop is on its way).
    ``_here`` is 0, or, while an asker's own thread runs the loop (`ask_here`), one more than
    the messages it took: its own first, then at most `HERE_AT_MOST` - 1 that came behind
    it (each answered with no thread woken for it), before it hands the rest to a worker.
    """

    __slots__ = ("_here", "_loop", "_name", "_parked", "_parked_at", "_pool")

    def __init__(self) -> None:
        super().__init__()
        # Parked until started: a message put before the loop's first run waits for it.
        self._parked = False
        self._here = 0
        self._parked_at = 0.0  # when it last parked (monotonic)
        self._loop: Callable[[], None] | None = None
        self._pool: LoopPool | None = None
        self._name = ""

    def put(self, envelope: Envelope[Any]) -> None:
        if self._put(envelope, here=False) is False:
            self._wake()

    def _put(self, envelope: Envelope[Any], *, here: bool) -> bool | None:
        """Queue ``envelope``. None: a loop runs already (or the mailbox is closed and the
        envelope refused); else the actor was parked and its loop is the caller's to run
        now: on this thread (True, only with ``here`` and the actor not hot), or on a
        worker (False)."""
        with self._lock:
            if self._closed:
                refuse = True
            else:
                refuse = False
                self._queue.put(envelope)
                if not self._parked:
                    return None
                self._parked = False
                if here and time.monotonic() - self._parked_at >= HOT_S:
                    self._here = 1
                    return True
                return False
        if refuse:
            _refuse(envelope)
        return None

    def get(self) -> Envelope[Any]:
        """The next message; with none queued, parks the actor (raises `_Parked`)."""
        with self._lock:
            if self._closed:  # pykka's teardown: it gets only from a non-empty inbox
                return self._queue.get_nowait()
            if self._queue.empty():
                self._here = 0
                self._parked = True
                self._parked_at = time.monotonic()
                raise _Parked
            if self._here == 0:
                return self._queue.get_nowait()
            if self._here <= HERE_AT_MOST:
                self._here += 1
                return self._queue.get_nowait()
            # The asker's thread has taken its share: it goes back to its own work, and
            # what is still queued goes to a worker.
            self._here = 0
        self._wake()
        raise _Parked

    def _wake(self) -> None:
        pool, loop = self._pool, self._loop
        assert pool is not None  # both set before the loop first ran
        assert loop is not None
        try:
            pool.run(loop, self._name)
        except Exception as exc:
            # No worker, and no thread could start: what was queued cannot run now. It is
            # answered "not delivered" (never handled, so a retry cannot duplicate it), and
            # the actor stays parked, whole, for its next message.
            log.error("could not resume an actor: %s", exc)
            self._unqueue(exc)

    def _unqueue(self, exc: BaseException) -> None:
        with self._lock:
            dropped = []
            while True:
                try:
                    dropped.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._parked = True
        error = SubagentControlError(
            ErrorCode.INTERNAL,
            f"no thread to run an actor on ({exc}); the message was not delivered; retry later",
        )
        for envelope in dropped:
            if envelope.reply_to is not None:
                with contextlib.suppress(queue.Full):  # answered already
                    envelope.reply_to.set_exception(exc_info=(type(error), error, None))


class ParkingActor(Actor):
    """An actor whose loop holds a pooled worker only while its mailbox has messages."""

    pooled_loop = True

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return cast("ActorInbox", ParkingInbox())

    def _start_actor_loop(self) -> None:
        inbox = cast(ParkingInbox, self.actor_inbox)
        inbox._pool = pool_for(daemon=self.use_daemon_thread)
        inbox._name = type(self).__name__
        inbox._loop = self._run
        super()._start_actor_loop()  # runs `_actor_loop` on a worker, or undoes the start

    def _actor_loop(self) -> None:
        self._actor_loop_setup()
        self._run()

    def _run(self) -> None:
        """pykka's loop until the mailbox is empty (the worker goes free) or the actor
        stopped (then pykka's teardown)."""
        try:
            self._actor_loop_running()
        except _Parked:
            return
        self._actor_loop_teardown()


def ask_here(ref: pykka.ActorRef[Any], message: Any) -> pykka.Future[Any]:
    """``ref.ask(message, block=False)``, for an asker that waits for the answer next: if
    the actor is parked and not hot (`HOT_S`), its loop runs on this thread for this
    message (and at most `HERE_AT_MOST` - 1 that come behind it; the rest go to a worker),
    saving the two thread wake-ups of a hand-off.

    Never on the main thread: a ``KeyboardInterrupt`` arrives there, and inside the
    actor's handler it would be the actor's failure (pykka stops every actor on one),
    not the asker's interruption.
    """
    inbox = ref.actor_inbox
    if not isinstance(inbox, ParkingInbox) or threading.current_thread() is threading.main_thread():
        return ref.ask(message, block=False)
    future: pykka.Future[Any] = ref.actor_class._create_future()
    run_here = inbox._put(Envelope(message, reply_to=future), here=True)
    if run_here:
        loop = inbox._loop
        assert loop is not None
        contextvars.Context().run(loop)  # what a worker starts each loop with
    elif run_here is not None:
        inbox._wake()
    return future
