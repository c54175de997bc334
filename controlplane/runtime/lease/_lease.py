"""This runtime's record of its own lease renewals, and what it may judge from it
through a store outage.

A lapsed lease means "dead" only if its runtime could have renewed it: when the store was
down, every runtime's heartbeats failed alike, and the leases that lapsed meanwhile say
nothing about who is alive. A runtime cannot see the store's outages except through its own
store calls, so it judges others by its own renewals: another runtime's lapsed lease counts
as death only once this runtime has renewed its own without a break for a full lease of the
other's (`Renewals.steady_for` >= its ``lease_ttl_s``). Until then the lapse is unknown, and
unknown is treated as alive: no sweep, no takeover, no kill settled here.

A break is anything that shows the store was not answering, or that this runtime could not
tell: a renewal that failed, one the store held longer than a third of the lease (a locked
or restarting store answers late rather than not at all: a retry that succeeds after an
outage is no proof the outage did not happen), a renewal still unanswered after that long,
or a gap longer than the lease between two renewals (this runtime was not looking).
Renewals go out every twentieth of the lease, a failed one retried at once
(`controlplane.runtime.lease._renewer`), so an outage long enough to lapse a lease of the same
length always breaks the run: runtimes sharing a store should share one ``lease_ttl_s``, as a
judge whose renewals are sparser than the judged's can miss an outage between two of them.

Several renewals may be in flight at once (a second goes out on another connection while
the first sits in TCP's retransmission): each is recorded by its own send time.

The run starts when the runtime registers (its first write). A runtime that opens just after
an outage cannot know there was one, so it too waits a full lease before it takes a lapsed
lease for death; what needs no store is judged at once (a closed row, a process gone on
this host and boot, a lease written before this host's reboot).

The clock is monotonic and local: no store call, no lock a store call holds, so the fencing
watchdog can read `last_renewed` while the heartbeat thread is stuck in a store call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Renewals"]

_BROKEN = float("inf")  # a run's start while the last renewal failed: no run yet


class Renewals:
    """This runtime's renewals on its own monotonic clock.

    The heartbeat thread calls `sending` before each renewal and `renewed` or `failed`
    with what it returned after; the judges read `steady_for`, the fencing watchdog
    `last_renewed`.

    Args:
        lease_ttl_s: This runtime's lease.
        clock: The monotonic clock (seconds).
    """

    def __init__(self, lease_ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ttl = lease_ttl_s
        self._slow_s = lease_ttl_s / 3  # longer than this is the store's doing
        self._lock = threading.Lock()
        now = clock()
        self._steady_since = now  # the runtime's row was written just before this
        self._last_ok_sent: float | None = None
        self._last_done = now
        self._in_flight: dict[float, int] = {}  # send time -> renewals sent then, unanswered

    def sending(self) -> float:
        """The clock's reading as a renewal is sent (pass it to `renewed` or `failed`)."""
        sent_at = self._clock()
        with self._lock:
            self._in_flight[sent_at] = self._in_flight.get(sent_at, 0) + 1
        return sent_at

    def _answered(self, sent_at: float) -> None:
        left = self._in_flight.get(sent_at, 0) - 1
        if left > 0:
            self._in_flight[sent_at] = left
        else:
            self._in_flight.pop(sent_at, None)

    def renewed(self, sent_at: float) -> None:
        """The renewal sent at ``sent_at`` succeeded."""
        now = self._clock()
        with self._lock:
            self._answered(sent_at)
            broken = self._steady_since == _BROKEN
            if broken or now - sent_at > self._slow_s or now - self._last_done > self._ttl:
                self._steady_since = now
            self._last_done = now
            if self._last_ok_sent is None or sent_at > self._last_ok_sent:
                self._last_ok_sent = sent_at

    def failed(self, sent_at: float) -> None:
        """The renewal sent at ``sent_at`` failed (the store refused or did not answer)."""
        # The break lasts until the next success, whenever it was sent.
        now = self._clock()
        with self._lock:
            self._answered(sent_at)
            self._steady_since = _BROKEN
            self._last_done = now

    def steady_for(self) -> float:
        """For how long (seconds) this runtime's renewals have succeeded without a break; 0
        while one is failing or has been unanswered for over a third of the lease."""
        now = self._clock()
        with self._lock:
            if self._in_flight and now - min(self._in_flight) > self._slow_s:
                return 0.0
            if now - self._last_done > self._ttl + self._slow_s:
                return 0.0  # no renewal for longer than the lease: not looking
            return max(0.0, now - self._steady_since)

    @property
    def last_renewed(self) -> float | None:
        """When (on the clock) the last renewal that succeeded was sent; None before the
        first (the registration is not counted: it was not timed)."""
        with self._lock:
            return self._last_ok_sent
