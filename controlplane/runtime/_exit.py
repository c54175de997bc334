"""Closing, at interpreter exit, the control planes a script left open.

A script that returns from ``main`` without `SubagentControl.close`, or dies of an exception
(a ``BrokenPipeError`` when its output is piped to ``head``), must exit. Every thread the
control plane starts is a daemon, so nothing keeps the interpreter alive; this module then
closes what is still open from an `atexit` hook, as ``close()`` would: running Tasks settle
``killed``, their turns are closed, the claims are given up. It runs after the interpreter
has joined the program's own non-daemon threads, so a thread still using a control plane is
never cut short by it.

Bounded: each close gets `EXIT_CLOSE_S` and runs on a daemon thread the hook waits for at
most `EXIT_GRACE_S` longer (a store that hangs, a provider that ignores its signal). A Task
whose activation has not settled by then is left running in the store, as a crash leaves it
(never settled over an open turn): the next runtime to open the store, or a live one within
two leases, settles it ``interrupted`` and closes its turn.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable

__all__ = ["EXIT_CLOSE_S", "EXIT_GRACE_S", "close_at_exit", "closed"]

EXIT_CLOSE_S = 5.0
"""The ``timeout_s`` of a close at exit: how long running activations get to settle."""
EXIT_GRACE_S = 5.0
"""How much longer the exit waits for the closes to finish (store writes, actor stops)."""


_lock = threading.Lock()
# Strong references: a control plane the program dropped without closing it still runs
# (its actors and runtime thread go on), so it must still be closed at exit.
_open: dict[object, Callable[[float], None]] = {}


def close_at_exit(control: object, close: Callable[[float], None]) -> None:
    """At interpreter exit, call ``close(EXIT_CLOSE_S)`` unless ``control`` was closed
    before (`closed`)."""
    with _lock:
        _open[control] = close


def closed(control: object) -> None:
    """``control`` is closed: nothing is left for the exit to do."""
    with _lock:
        _open.pop(control, None)


def _close_all() -> None:
    with _lock:
        closes = list(_open.values())
        _open.clear()
    if not closes:
        return
    deadline = time.monotonic() + EXIT_CLOSE_S + EXIT_GRACE_S
    closers = [
        threading.Thread(
            target=close,
            args=(EXIT_CLOSE_S,),
            name="subagent-control-exit-close",
            daemon=True,  # past the bound it is cut off like the rest: a crash, at worst
        )
        for close in closes
    ]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(max(0.0, deadline - time.monotonic()))


def _forget_in_forked_child() -> None:
    # A forked child shares the parent's store: closing the parent's control planes from
    # it would give up the parent's claims. It closes only what it opens itself.
    global _lock
    _lock = threading.Lock()
    _open.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_in_forked_child)
