"""The base of every actor here: pykka's `ThreadingActor`, minus one leak, on a lighter
inbox, answering on a lighter future.

`pykka.Actor.start` registers the actor *before* it starts the actor's thread. When the
thread cannot start (``RuntimeError: can't start new thread`` at the process's thread
ceiling), the registry keeps a ref whose actor never runs: `pykka.ActorRegistry.stop_all`
then waits for it forever, and a `tell` to it is queued into the void.

The inbox is a `queue.SimpleQueue` rather than pykka's `queue.Queue`: the same FIFO
(``put``, ``get``, ``empty`` are all pykka asks of an inbox), written in C, without the
three `threading.Condition` objects (~3 KiB) a `queue.Queue` carries and the Python-level
locking each message pays through them. A live child has two actors, so this is memory per
live child and time per steer. The inbox also closes when the actor's loop ends: pykka
answers the asks still queued then with `pykka.ActorDeadError`, and an ask that races the
stop (put after that last drain) is answered the same way at once, instead of waiting in a
queue nobody reads. So every ask of our actors is answered — handled, or `ActorDeadError`
for "never handled" — and nobody polls an actor's liveness to find out which.

An ``ask``'s reply is a `Reply`: pykka's `ThreadingFuture` contract (``get`` with a timeout
raising `pykka.Timeout`, ``set``/``set_exception`` once, get hooks for ``map``/``join``)
on two plain locks instead of a `threading.Condition`, whose Python-level ``wait`` and
``notify`` every steer paid for.

An actor class with `Actor.pooled_loop` runs its loop on a reused worker thread
(`actors._pool`) instead of a new one: the same pykka loop, minus a thread start.

Every actor runs on a daemon thread (pykka's default is non-daemon). A script that returns
from ``main`` without `SubagentControl.close`, or dies of an exception (a broken pipe), must
still exit; non-daemon actors would keep its interpreter alive for ever. The control plane
closes what is still open at exit, within a bound (`controlplane.runtime._exit`), so the actors are
stopped in order when they can be, and cut off like a crash when they cannot.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import pykka

from actors._pool import pool_for

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope
    from pykka._future import GetHookFunc
    from pykka._types import OptExcInfo

__all__ = ["Actor", "Reply"]


class _Inbox:
    """An actor's mailbox that refuses, once closed, every envelope put into it: an ask's
    future gets `pykka.ActorDeadError` at once (the message was never handled), a tell is
    dropped (as pykka drops a tell racing a stop).

    The lock makes "closed" and "put" one step: without it an envelope could be put right
    after the loop's last drain and wait for ever.
    """

    __slots__ = ("_closed", "_lock", "_queue")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def put(self, envelope: Envelope[Any]) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put(envelope)
                return
        _refuse(envelope)

    def get(self) -> Envelope[Any]:
        return self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Refuse every later put; what is queued stays for the loop's teardown."""
        with self._lock:
            self._closed = True


def _refuse(envelope: Envelope[Any]) -> None:
    reply = envelope.reply_to
    if reply is None:
        return
    dead = pykka.ActorDeadError("the actor stopped before handling the message")
    with contextlib.suppress(queue.Full):  # answered already: nothing to refuse
        reply.set_exception(exc_info=(pykka.ActorDeadError, dead, None))


class Actor(pykka.ThreadingActor):
    """A `pykka.ThreadingActor` that leaves nothing behind when its thread cannot start."""

    use_daemon_thread: ClassVar[bool] = True

    pooled_loop: ClassVar[bool] = False
    """Run the loop on an idle worker of `actors._pool` (daemon or not, as
    ``use_daemon_thread`` says), or on a new worker thread if none waits."""

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return Reply()

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return cast("ActorInbox", _Inbox())

    def _actor_loop_teardown(self) -> None:
        # Closed first: pykka's teardown then answers what is queued, and nothing can be
        # queued after it (see `_Inbox`).
        _close_inbox(self.actor_inbox)
        super()._actor_loop_teardown()

    def _start_actor_loop(self) -> None:
        try:
            if self.pooled_loop:
                pool_for(daemon=self.use_daemon_thread).run(self._actor_loop, type(self).__name__)
            else:
                super()._start_actor_loop()
        except BaseException:
            # Re-raised as is (KeyboardInterrupt included): only the registration and the
            # "alive" state are undone, so the failed start is what the caller sees.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            _close_inbox(self.actor_inbox)
            while not self.actor_inbox.empty():  # asked before the failed start: answered
                _refuse(self.actor_inbox.get())
            raise


def _close_inbox(inbox: ActorInbox) -> None:
    if isinstance(inbox, _Inbox):
        inbox.close()


T = TypeVar("T")


class Reply(pykka.ThreadingFuture[T]):
    """A `pykka.ThreadingFuture` on two locks: ``_done`` is held until the value (or a get
    hook) is in, and every ``get`` passes through it; under ``_guard``, ``set`` and
    ``set_exception`` succeed once, and never after a get hook, and a get hook never after
    them (`queue.Full`), as pykka's do. Nothing of `pykka.ThreadingFuture`'s own state is
    used. One difference: a ``get`` already waiting when a get hook is set returns the
    hook's value (pykka's waits on until its timeout)."""

    def __init__(self) -> None:
        pykka.Future.__init__(self)  # the get hook's state only
        self._guard = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()
        self._value: Any = None
        self._exc_info: OptExcInfo | None = None
        self._in = False

    def get(self, *, timeout: float | None = None) -> Any:
        done = self._done
        if not done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise pykka.Timeout(f"{timeout} seconds")
        done.release()  # open for good: every later `get` passes at once
        if self._get_hook is not None:
            return pykka.Future.get(self, timeout=timeout)  # the hook waits on its own
        exc_info = self._exc_info
        if exc_info is None:
            return self._value
        exc_type, exc_value, exc_traceback = exc_info
        assert exc_type is not None
        if exc_value is None:
            exc_value = exc_type()
        if exc_value.__traceback__ is not exc_traceback:
            raise exc_value.with_traceback(exc_traceback)
        raise exc_value

    def set(self, value: Any | None = None) -> None:
        with self._guard:
            self._claim()
            self._value = value
        self._done.release()

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        assert exc_info is None or len(exc_info) == 3
        with self._guard:
            self._claim()
            self._exc_info = exc_info if exc_info is not None else sys.exc_info()
        self._done.release()

    def set_get_hook(self, func: GetHookFunc[T]) -> None:
        with self._guard:
            if self._in:
                raise queue.Full
            first = self._get_hook is None
            pykka.Future.set_get_hook(self, func)  # a later hook replaces it, as in pykka
        if first:
            self._done.release()

    def _claim(self) -> None:
        if self._in or self._get_hook is not None:
            raise queue.Full
        self._in = True
