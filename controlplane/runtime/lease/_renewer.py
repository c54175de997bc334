"""The renewals of this runtime's lease: sent often, and retried at once, so that a short
outage costs no fencing whatever its phase against them.

One thread paces them. While the last renewal sent was answered, the next goes out
`RENEW_EVERY` of the lease after it; while it is unanswered or failed, another goes out
`RETRY_EVERY` of the lease after it, on its own thread and so on another connection: a
renewal whose packets the kernel dropped sits in TCP's retransmission (or a connect in the
SYN's backoff: a second, then three) long past the heal, and must not hold up the next. A
renewal is bounded by `ATTEMPT_BOUND` of the lease (the store's deadline shuts its socket
down and the pool drops the connection); at most `MAX_IN_FLIGHT` are unanswered at once.

The arithmetic, with ``L`` the lease, ``P = RENEW_EVERY * L`` and ``R = RETRY_EVERY * L``
(the watchdog fences at ``FENCE_AT * L`` after the last successful renewal's send,
`controlplane.runtime.lease._own_lease`):

- An outage from ``a`` to ``a + D``: the last renewal answered before it was sent at
  ``a - P`` or later. After the heal, a renewal goes out within ``R`` on a connection that
  no dropped packet holds up, and is answered within a round trip. So the runtime is not
  fenced while ``D + P + R + round trip < FENCE_AT * L``: with ``FENCE_AT = 0.75``,
  ``P = L/20`` and ``R = L/40``, ``D < 0.675 L`` less a round trip. An outage of half the
  lease leaves ``0.175 L`` (0.5 s for a 3 s lease) for the round trip and the scheduling.
- A flapping link is a series of outages: none over ``0.675 L`` fences.
- A renewal that succeeds after failures tells the runtime the store is back (``on_back``):
  it then has its listeners listen again on new connections and ends the store calls still
  waiting since before that renewal was sent (retried on new connections), since a
  connection that lived through the outage can hold notifications back, or sit in TCP's
  retransmission, for seconds more (`persistence._listening`, `persistence._deadlines`).
- Safety is the watchdog's (``FENCE_AT < 1``, counted from sends); the renewals only make
  it fire less often. The store stamps a renewal with its own clock when it arrives, and
  never moves the stamp back (two renewals in flight may commit out of order), so the
  stamp is never earlier than the send of any renewal credited here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from controlplane.runtime.lease._lease import Renewals
    from controlplane.runtime.lease._own_lease import OwnLease

__all__ = ["ATTEMPT_BOUND", "MAX_IN_FLIGHT", "RENEW_EVERY", "RETRY_EVERY", "Renewer"]

log = logging.getLogger(__name__)

RENEW_EVERY: Final = 1 / 20
"""Between two renewals while they are answered: this fraction of ``lease_ttl_s``."""

RETRY_EVERY: Final = 1 / 40
"""After a renewal that failed or is still unanswered, the next one goes out this fraction
of ``lease_ttl_s`` after it was sent."""

ATTEMPT_BOUND: Final = 1 / 3
"""Each renewal's deadline, a fraction of ``lease_ttl_s`` (a connect takes at least 2 s
to give up: libpq's floor). Longer is the store's doing: it breaks the run of renewals
that lets this runtime judge others dead (`controlplane.runtime.lease._lease`) either way."""

MAX_IN_FLIGHT: Final = 16
"""At most this many renewals unanswered at once (each holds a thread and a connection):
at one every `RETRY_EVERY` each bounded by `ATTEMPT_BOUND`, ``16 * 1/40 > 1/3``, so a
renewal stuck to its bound never keeps the next from going out."""


class Renewer:
    """Sends this runtime's renewals on a thread of its own.

    Args:
        runtime_id: The runtime's id (for the threads' names and the log).
        lease_ttl_s: The lease.
        renew: One renewal within the bound it is given (seconds): whether the runtime's
            row is still open; raises when the store did not answer in time.
        renewals: Where each renewal's send and answer are recorded.
        lease: The watchdog, told of each success, or that the row is closed.
        reopen: Called (on a renewal's thread, one at a time) when the store said the row
            is closed or gone.
        on_back: Called (on a renewal's thread) with its send time when a renewal
            succeeds after one or more sent later than the last success failed: the store
            answers again after an outage.
    """

    def __init__(
        self,
        runtime_id: str,
        lease_ttl_s: float,
        renew: Callable[[float], bool],
        renewals: Renewals,
        lease: OwnLease,
        reopen: Callable[[], object],
        on_back: Callable[[float], object] | None = None,
    ) -> None:
        self._runtime_id = runtime_id
        self._on_back = on_back
        self._every = lease_ttl_s * RENEW_EVERY
        self._retry = lease_ttl_s * RETRY_EVERY
        self._bound = lease_ttl_s * ATTEMPT_BOUND
        self._renew = renew
        self._renewals = renewals
        self._lease = lease
        self._reopen = reopen
        self._reopening = threading.Lock()
        self._changed = threading.Condition(threading.Lock())
        self._stopped = False
        self._in_flight = 0
        self._last_sent = float("-inf")
        self._last_answered = True  # a renewal succeeded since the last was sent
        self._failures = 0  # in a row, for the log (and `on_back`)
        self._last_ok_sent = float("-inf")  # the send time of the last renewal that succeeded
        self._thread: threading.Thread | None = None
        self.sent = 0
        """How many renewals were sent (for tests)."""

    def start(self) -> None:
        """Start pacing renewals (the first goes out a period from now)."""
        self._last_sent = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"subagent-renewals:{self._runtime_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Send no more renewals; wait up to ``timeout_s`` for those in flight. Whether
        none is left in flight (one stuck on a silent network is left behind: a daemon
        thread that its deadline ends)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            idle = self._in_flight == 0
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        return idle

    def _run(self) -> None:
        with self._changed:
            while not self._stopped:
                gap = self._every if self._last_answered else self._retry
                left = self._last_sent + gap - time.monotonic()
                if left > 0 or self._in_flight >= MAX_IN_FLIGHT:
                    self._changed.wait(left if left > 0 else None)
                    continue
                self._in_flight += 1
                self.sent += 1
                self._last_answered = False
                self._last_sent = time.monotonic()
                sent_at = self._renewals.sending()
                threading.Thread(
                    target=self._attempt, args=(sent_at,), daemon=True,
                    name=f"subagent-renewal:{self._runtime_id}",
                ).start()  # fmt: skip

    def _attempt(self, sent_at: float) -> None:
        try:
            alive = self._renew(self._bound)
        except BaseException as exc:  # a failed renewal is retried; nothing to raise to
            self._renewals.failed(sent_at)
            self._answer(sent_at, ok=False, why=str(getattr(exc, "message", exc)))
            return
        if alive:
            self._renewals.renewed(sent_at)
            self._lease.renewed()
            self._answer(sent_at, ok=True, why="")
            return
        self._renewals.failed(sent_at)
        self._lease.lose("its row is closed or gone; it is dead to the others")
        self._answer(sent_at, ok=False, why="its row is closed or gone")
        # A row deleted while this runtime was cut off (expired) comes back fresh, and the
        # next renewal re-arms the lease; a closed one stays closed, and the runtime fenced.
        if self._reopening.acquire(blocking=False):
            try:
                self._reopen()
            except Exception as exc:
                log.warning("runtime %s: could not write its row again (%s)",
                            self._runtime_id, getattr(exc, "message", exc))  # fmt: skip
            finally:
                self._reopening.release()

    def _answer(self, sent_at: float, *, ok: bool, why: str) -> None:
        with self._changed:
            self._in_flight -= 1
            back = ok and self._failures > 0
            if ok:
                # The store answers now: back to the period, from the last send.
                self._last_answered = True
                self._failures = 0
                self._last_ok_sent = max(self._last_ok_sent, sent_at)
            elif sent_at > self._last_ok_sent:
                self._failures += 1
            # else: sent before a renewal that succeeded, it failed late: no new outage
            failures = self._failures
            self._changed.notify_all()
        if back and self._on_back is not None:
            try:
                self._on_back(sent_at)
            except Exception:  # the renewals must outlive a bug in what they call
                log.exception("runtime %s: acting on the store's return failed", self._runtime_id)
        if not ok and (failures in (1, 10) or failures % 100 == 0):
            log.warning("runtime %s: a lease renewal failed (%s; %d in a row); retrying",
                        self._runtime_id, why, failures)  # fmt: skip
