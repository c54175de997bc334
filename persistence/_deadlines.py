"""Client-side deadlines of store calls, so that a silent network cannot hang a thread.

A partition that keeps connections open and passes no byte is the one fault the server
cannot bound: ``statement_timeout`` runs on the server, which never hears the statement,
and TCP's own checks (``tcp_user_timeout``, keepalives) see nothing wrong when something in
between (a proxy, a load balancer, a NAT box) acknowledges the bytes and holds them. So
the client bounds every wait for the server itself:

- Each wait of a PostgreSQL connection for its server (a statement, a fetch, a COMMIT)
  is watched: past its bound a reaper thread shuts the connection's socket down, the wait
  fails as a lost connection (transient: the retry policy reconnects) and the pool drops
  the connection. The bound is the statement timeout plus `SILENCE_GRACE_S` (a live server
  answers within ``statement_timeout``, if only to cancel the statement), or less inside
  `call_deadline` (whose connects are given up within psycopg's poll interval, 0.1 s,
  once it passes, below libpq's 2 s floor). psycopg's
  own wait runs untouched (its C loop is the hot path); the
  watch costs a dictionary entry per wait.
- `call_deadline` bounds every store call a thread makes inside it, retries included:
  the runtime's heartbeat must fail in time for the next one, and `close` must return
  while the network is silent. On SQLite (a local file, no network) lock waits are bounded
  by the busy timeout; the deadline stops the retries.
- `abandoning` ends a thread's calls once its caller gives them up (a fenced activation):
  a wait for the server at once (`abandon_waits`), a connection attempt within psycopg's
  poll interval (0.1 s; its socket is not watched until it connects, and libpq's connect
  timeout is 2 s at least: a fenced activation stayed alive that long, past the quarter of
  the lease it has to stop in), a wait for a pooled connection (`DeadlinePool`) and a
  retry's backoff (`abandonable_sleep`) within `POLL_S`. Both also end at the call's
  deadline: a pool taken by calls stuck on a silent network made a fenced activation
  wait for a connection (SQLAlchemy's 30 s) past its fence.
- `unqueued`: a lease renewal never waits for a pooled connection; it opens one past the
  pool's size when none is free (closed when it comes back), so that calls stuck on a
  silent network, which hold the pool until their deadlines, cannot keep the renewals
  that would ride the outage through from going out when it heals.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Final

from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool
from sqlalchemy.util import queue as sa_queue

__all__ = [
    "POLL_S",
    "SILENCE_GRACE_S",
    "DeadlinePool",
    "abandon_waits",
    "abandonable_sleep",
    "abandoning",
    "bounded_connection_class",
    "call_deadline",
    "connect_bounded",
    "is_abandoned",
    "time_left",
    "unqueued",
]

log = logging.getLogger(__name__)

SILENCE_GRACE_S: Final = 2.0
"""How long past the statement timeout a PostgreSQL connection may stay silent."""

POLL_S: Final = 0.05
"""How often a wait for a pooled connection or a retry's backoff looks whether its call
was abandoned."""

_local = threading.local()


def call_deadline(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Bound every store call this thread makes in the block, retries included, to end
    within ``seconds`` of entering it (an enclosing deadline that ends sooner wins)."""
    return _Deadline(seconds)


class _Deadline:
    """`call_deadline`'s block (a class: a ``@contextmanager`` generator costs more than
    the rest of a store call's own work around its SQL)."""

    __slots__ = ("_outer", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def __enter__(self) -> None:
        outer: float | None = getattr(_local, "until", None)
        until = time.monotonic() + self._seconds
        self._outer = outer
        _local.until = until if outer is None else min(outer, until)

    def __exit__(self, *_exc: object) -> None:
        _local.until = self._outer


def time_left() -> float | None:
    """Seconds left before this thread's `call_deadline` (None outside one)."""
    until: float | None = getattr(_local, "until", None)
    if getattr(_local, "abandon", None) is not None and _local.abandon():
        return 0.0
    return None if until is None else until - time.monotonic()


def abandoning(abandoned: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    """Store calls this thread makes in the block stop retrying once ``abandoned()`` is
    true (their `call_deadline` has passed, as it were), and `abandon_waits` of this
    thread ends the wait in progress at once. An activation's writes run inside one: once
    its runtime fenced it, a write stuck on a silent network is of no use to anyone, and
    the activation must be quiescent before another runtime may take its child over."""
    return _Abandoning(abandoned)


class _Abandoning:
    """`abandoning`'s block; a class, as `_Deadline` is (every steer's append enters one)."""

    __slots__ = ("_abandoned", "_outer")

    def __init__(self, abandoned: Callable[[], bool]) -> None:
        self._abandoned = abandoned

    def __enter__(self) -> None:
        self._outer = getattr(_local, "abandon", None)
        _local.abandon = self._abandoned

    def __exit__(self, *_exc: object) -> None:
        _local.abandon = self._outer


def is_abandoned() -> bool:
    """Whether this thread's calls are abandoned (`abandoning`)."""
    check = getattr(_local, "abandon", None)
    return check is not None and bool(check())


def abandon_waits(thread_ids: Collection[int]) -> None:
    """End at once the waits for the server that the threads ``thread_ids`` are in (their
    sockets are shut down: the wait fails as a lost connection)."""
    _REAPER.cut(thread_ids)


def cut_waits_begun_before(moment: float, scope: object) -> int:
    """End at once every wait for the server begun before ``moment`` (the monotonic
    clock) on a connection of ``scope`` (the one given to `bounded_connection_class`: a
    store's engine) that is still waiting: that store's network was out, and a
    connection that was sending when it went can sit in TCP's retransmission for seconds
    after it is back; its call fails as a lost connection, and the store's retry goes on a
    new one. Another store's waits are left alone: its network may never have been out.
    How many."""
    return _REAPER.cut_begun_before(moment, scope)


class _Reaper:
    """One thread per process that shuts down the sockets of waits past their bound."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # ticket -> (until, socket fd, the waiting thread, when the wait began, its scope)
        self._waits: dict[int, tuple[float, int, int, float, object]] = {}
        self._reaped: set[int] = set()
        self._tickets = iter(range(1, 1 << 62))
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")
        """When the reaper's sleep ends (inf: when notified). A watch wakes it only to
        make that sooner: the waits of one process share a bound, so a new one nearly
        always ends after the one the reaper sleeps for, even if that one has ended since
        (waking the reaper on every statement cost a cross-thread hand-off per wait)."""
        self.wakes = 0
        """How many times a watch woke the reaper (for tests)."""

    def watch(self, fd: int, bound: float, scope: object = None) -> int:
        now = time.monotonic()
        until = now + bound
        with self._cond:
            ticket = next(self._tickets)
            self._waits[ticket] = (until, fd, threading.get_ident(), now, scope)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="subagent-store-deadlines", daemon=True
                )
                self._wakes_at = until  # its first look at the waits sees this one
                self._thread.start()
            elif until < self._wakes_at:
                self._wakes_at = until
                self.wakes += 1
                self._cond.notify()
        return ticket

    def done(self, ticket: int) -> bool:
        """End a watch; whether its socket was shut down for silence."""
        with self._cond:
            self._waits.pop(ticket, None)
            if ticket in self._reaped:
                self._reaped.discard(ticket)
                return True
            return False

    def cut(self, thread_ids: Collection[int]) -> None:
        """Shut down now the sockets that the threads ``thread_ids`` wait on."""
        with self._cond:
            cut = [(t, w[1]) for t, w in self._waits.items() if w[2] in thread_ids]
            self._shut(cut)

    def cut_begun_before(self, moment: float, scope: object) -> int:
        """Shut down now the sockets of the waits of ``scope`` begun before ``moment``;
        how many."""
        with self._cond:
            cut = [
                (t, fd)
                for t, (_u, fd, _tid, began, of) in self._waits.items()
                if began < moment and of is scope
            ]
            self._shut(cut)
        return len(cut)

    def _shut(self, cut: list[tuple[int, int]]) -> None:
        # Under the lock: the wait cannot end (and its connection close, its fd be reused)
        # before the shutdown reaches the right socket.
        for ticket, fd in cut:
            del self._waits[ticket]
            self._reaped.add(ticket)
            _shut_down(fd)

    def _next_until(self) -> float:
        return min((wait[0] for wait in self._waits.values()), default=float("inf"))

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                overdue = [(t, w[1]) for t, w in self._waits.items() if w[0] <= now]
                self._shut(overdue)
                if not overdue:
                    next_until = self._next_until()
                    if next_until == float("inf") and self._wakes_at > now:
                        # Nothing to watch, but keep the sleep a watch set: a new wait
                        # (same bound, later start) then ends after it and wakes no one.
                        next_until = self._wakes_at
                    self._wakes_at = next_until
                    self._cond.wait(None if next_until == float("inf") else next_until - now)


def _shut_down(fd: int) -> None:
    try:
        # A second socket object on the same descriptor: shutdown acts on the connection
        # (the waiting thread's poll wakes at once), detach leaves the descriptor open for
        # its owner to close.
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()
    except OSError as exc:  # already closed or reset: the wait ends on its own
        log.debug("could not shut down a silent store connection: %s", exc)


_REAPER = _Reaper()


def connect_bounded(connection_class: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
    """Connect with ``connection_class``, the connect timeout cut to this thread's
    `call_deadline` (libpq's floor is 2 s); none at all once the deadline has passed."""
    left = time_left()
    if left is not None:
        import psycopg

        if left <= 0:
            raise psycopg.OperationalError("no time left to connect (the call's deadline passed)")
        given = int(cparams.get("connect_timeout") or 0)
        cut = max(2, math.ceil(left))
        cparams = {**cparams, "connect_timeout": cut if given <= 0 else min(given, cut)}
    return connection_class.connect(*cargs, **cparams)


def bounded_connection_class(silence_s: float, scope: object = None) -> Any:
    """A psycopg ``Connection`` subclass whose every wait for the server fails after
    ``silence_s`` seconds (or when this thread's `call_deadline` ends, if sooner). Its
    waits belong to ``scope`` (a store's engine), the one `cut_waits_begun_before` names."""
    import psycopg

    class BoundedConnection(psycopg.Connection[Any]):
        @classmethod
        def _connect_gen(cls, *args: Any, **kwargs: Any) -> Any:
            # psycopg 3.3's connection attempt, polled every 0.1 s: given up when abandoned.
            return _abandonable(super()._connect_gen(*args, **kwargs))

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            left = time_left()
            bound = silence_s if left is None else max(0.0, min(silence_s, left))
            try:
                fd = self.pgconn.socket
            except psycopg.OperationalError:  # lost already: the wait fails on its own
                return super().wait(*args, **kwargs)
            ticket = _REAPER.watch(fd, bound, scope)
            try:
                return super().wait(*args, **kwargs)
            except psycopg.OperationalError as exc:
                if _REAPER.done(ticket):
                    raise psycopg.OperationalError(
                        f"the database did not answer within {bound:.3g}s (a silent network?); "
                        "the connection was closed"
                    ) from exc
                raise
            finally:
                _REAPER.done(ticket)

    return BoundedConnection


def _abandonable(gen: Any) -> Any:
    """A connection attempt's generator (psycopg's: it yields what to wait for, and is
    sent what is ready, at least every poll interval) that fails once this thread's calls
    are abandoned (`abandoning`) or its `call_deadline` has passed, instead of waiting
    out the connect timeout (libpq's floor is 2 s: a renewal's deadline may be shorter)."""
    import psycopg

    try:
        wanted = next(gen)
        while True:
            left = time_left()  # 0 once abandoned
            if left is not None and left <= 0:
                raise psycopg.OperationalError(
                    "connection attempt abandoned (its caller gave it up, or its deadline passed)"
                )
            wanted = gen.send((yield wanted))
    except StopIteration as done:
        return done.value
    finally:
        gen.close()


def abandonable_sleep(seconds: float) -> None:
    """Sleep ``seconds`` (a retry's backoff), or less: until this thread's calls are
    abandoned (`abandoning`), looked at every `POLL_S`."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0 or is_abandoned():
            return
        time.sleep(min(left, POLL_S))


def unqueued() -> contextlib.AbstractContextManager[None]:
    """Store calls this thread makes in the block never wait for a pooled connection
    (`DeadlinePool`): a lease renewal's."""
    return _Unqueued()


class _Unqueued:
    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        self._outer = getattr(_local, "unqueued", False)
        _local.unqueued = True

    def __exit__(self, *_exc: object) -> None:
        _local.unqueued = self._outer


class _DeadlineQueue(sa_queue.Queue[ConnectionPoolEntry]):
    """The pool's queue of idle connections: a thread with a `call_deadline` (or inside
    `abandoning`) waits for one no longer than its deadline, and stops once abandoned."""

    def get(self, block: bool = True, timeout: float | None = None) -> ConnectionPoolEntry:
        if not block or (
            getattr(_local, "until", None) is None and getattr(_local, "abandon", None) is None
        ):
            return super().get(block, timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            step = POLL_S
            left = time_left()
            if left is not None:
                if left <= 0:
                    raise sa_queue.Empty
                step = min(step, left)
            if end is not None:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise sa_queue.Empty
                step = min(step, remaining)
            try:
                return super().get(True, step)
            except sa_queue.Empty:
                continue


class DeadlinePool(QueuePool):
    """SQLAlchemy's ``QueuePool`` whose wait for a free connection ends at the calling
    thread's `call_deadline` or once its calls are abandoned (within `POLL_S`), and
    which never makes a thread inside `unqueued` wait: it opens a connection past the
    pool's size, counted as overflow, so the pool closes it when it comes back."""

    _queue_class = _DeadlineQueue

    def _do_get(self) -> ConnectionPoolEntry:
        if getattr(_local, "unqueued", False):
            try:
                return self._pool.get(False)
            except sa_queue.Empty:
                pass
            with self._overflow_lock:
                self._overflow += 1
            try:
                return self._create_connection()
            except BaseException:
                self._dec_overflow()
                raise
        try:
            return super()._do_get()
        except sa_exc.TimeoutError as exc:
            if is_abandoned():
                raise sa_exc.TimeoutError(
                    "no pooled connection was free before the call was abandoned"
                ) from exc
            left = time_left()
            if left is not None and left <= 0:
                raise sa_exc.TimeoutError(
                    "no pooled connection was free before the call's deadline"
                ) from exc
            raise
