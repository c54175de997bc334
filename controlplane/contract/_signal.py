"""Out-of-band cancellation for one activation."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controlplane.contract._errors import ErrorCode, SubagentControlError

__all__ = ["CancelSignal", "LazyEvent"]

log = logging.getLogger(__name__)

_MAKING = threading.Lock()  # makes a `LazyEvent`'s Event (rare: a wait that blocks)


class LazyEvent:
    """A `threading.Event` that makes its Event only for a `wait` that has to block.

    Every live activation holds several set-once flags (its cancel signal, its Task's
    release, its transcript's publication), nearly none of them ever waited on while
    unset; an Event (its Condition, lock and deque) is about a KiB of each live child's
    memory. Here a flag is a slot, read without a lock, and the Event exists only once a
    waiter needs it. ``set``, ``clear`` and the Event's making are ordered by one lock, so
    a waiter that made the Event is woken by the next ``set``, and one that came after a
    ``set`` does not wait.
    """

    __slots__ = ("_event", "_flag")

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """Whether it is set."""
        return self._flag

    def set(self) -> None:
        """Set it and wake every waiter."""
        with _MAKING:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def clear(self) -> None:
        """Unset it: a `wait` from now on blocks until the next `set`."""
        with _MAKING:
            self._flag = False
            if self._event is not None:
                self._event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds pass; returns whether it is set."""
        if self._flag:
            return True
        with _MAKING:
            if self._flag:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)


class CancelSignal:
    """A thread-safe cancellation state; the first reason wins.

    Set out-of-band (never a mailbox message, which would queue behind a blocked turn)
    and checked by the activation and the provider at their checkpoints.
    """

    __slots__ = (
        "_callbacks",
        "_cause",
        "_event",
        "_fence_callbacks",
        "_fenced",
        "_lock",
        "_reason",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = LazyEvent()  # waited on only by a provider's sleep
        self._reason: str | None = None
        self._cause: ErrorCode | None = None
        self._callbacks: list[Callable[[str], object]] = []
        self._fenced = False
        self._fence_callbacks: list[Callable[[str], object]] = []

    @property
    def aborted(self) -> bool:
        """Whether the signal has been aborted."""
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        """The first abort reason, or None while not aborted."""
        return self._reason

    @property
    def cause(self) -> ErrorCode | None:
        """Why the control plane aborted, when it was not a kill: ``INTERNAL`` (the
        activation's supervisor failed; its Task settles ``failed``), ``FENCED`` (its
        runtime lost the child's claim; ``interrupted``) or ``CLOSED`` (its runtime is
        closing: ``killed``, unless its run waits for an approval answer and parks). None
        for a kill."""
        return self._cause

    @property
    def fenced(self) -> bool:
        """Whether the control plane fenced the activation (cause ``FENCED``: its runtime
        lost the child's claim, or could not renew its lease), also when an earlier abort
        (a kill) set the reason and cause: the activation's store calls are abandoned
        either way, since another runtime may take the child over once the lease lapses."""
        return self._fenced

    def abort(self, reason: str, *, cause: ErrorCode | None = None) -> bool:
        """Abort with ``reason``; returns False (and keeps the first reason) if already aborted.
        An abort with cause ``FENCED`` marks the signal `fenced` either way.

        Args:
            reason: Why, in words; it becomes the Task's detail.
            cause: For the control plane's own aborts, the code that says how the Task
                settles (see `cause`); None for a kill.
        """
        fence_callbacks: list[Callable[[str], object]] = []
        with self._lock:
            if cause is ErrorCode.FENCED and not self._fenced:
                self._fenced = True
                fence_callbacks, self._fence_callbacks = self._fence_callbacks, []
            first = not self._event.is_set()
            callbacks: list[Callable[[str], object]] = []
            if first:
                self._reason = reason
                self._cause = cause
                self._event.set()
                callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._run(callback, reason)
        for callback in fence_callbacks:
            self._run(callback, reason)
        return first

    def wait(self, timeout: float | None = None) -> bool:
        """Block until aborted or ``timeout`` seconds pass; returns whether it is aborted."""
        return self._event.wait(timeout)

    def add_callback(self, fn: Callable[[str], object]) -> None:
        """Run ``fn(reason)`` once on abort; at once (in this thread) if already aborted."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
            reason = self._reason
        assert reason is not None
        self._run(fn, reason)

    def add_fence_callback(self, fn: Callable[[str], object]) -> None:
        """Run ``fn(reason)`` once when the control plane fences the activation (`fenced`),
        whether or not it was aborted before; at once (in this thread) if already fenced."""
        with self._lock:
            if not self._fenced:
                self._fence_callbacks.append(fn)
                return
            reason = self._reason
        assert reason is not None
        self._run(fn, reason)

    def raise_if_aborted(self) -> None:
        """Raise ``CANCELLED`` with the abort reason if the signal is aborted."""
        if self._event.is_set():
            raise SubagentControlError(ErrorCode.CANCELLED, f"cancelled: {self._reason}")

    @staticmethod
    def _run(callback: Callable[[str], object], reason: str) -> None:
        try:
            callback(reason)
        except BaseException:  # escaping, it would stop every actor
            # A faulty callback must not stop the others or the thread that aborted.
            log.exception("cancel callback %r failed", callback)

    def __repr__(self) -> str:
        state = f"aborted: {self._reason!r}" if self.aborted else "live"
        return f"<CancelSignal {state}>"
