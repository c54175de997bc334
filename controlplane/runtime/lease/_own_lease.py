"""This runtime's own lease as it sees it, and the watchdog that fences the runtime before
that lease can lapse in anyone else's eyes.

Fencing keeps a cut-off runtime's writes out of the store, not its side effects out of
the world: a runtime partitioned from PostgreSQL (connections open, no byte passing) would
go on calling models and tools after another runtime took its children over. So the
runtime judges its own lease, on its own clock, and never by asking the store:

- Each renewal is timed from when it was *sent*. Others judge the lease by the row's
  ``heartbeat_at``, stamped by the server when the renewal arrived, so no later than the
  server saw it: a lease renewed by a renewal sent at ``t`` lapses for everyone after
  ``t + lease_ttl_s`` at the earliest (the server's clock and this monotonic clock tick at
  the same rate to within NTP's slew, 500 ppm). Timing it from the answer instead would
  credit the runtime with however long the answer took.
- The watchdog acts at `FENCE_AT` of ``lease_ttl_s`` after the last successful renewal was
  sent. The arithmetic of safety: the others see the lease lapse no sooner than
  ``lease_ttl_s`` after the store stamped the renewal, the stamp is no earlier than the
  send (and never moves back), so the runtime fences ``(1 - FENCE_AT) * lease_ttl_s``
  (0.75 s of a 3 s lease, 2.5 s of the default 10 s) before anyone may take its children
  over: that margin is for the watchdog itself to be scheduled late (a loaded host) and
  for the activations to notice their cancellation.
- What it leaves for a store that stops answering: renewals go out every twentieth of
  the lease and a failed or unanswered one is retried at once on another connection
  (`controlplane.runtime.lease._renewer`, with the arithmetic of the ride-through: any outage
  shorter than 0.675 of the lease less a round trip, whatever its phase against the renewals).
  A fence at 0.8 of the lease was tried: the kernel-fault stress run then counted
  double activations (an activation's end, its disposal included, can take longer on a
  loaded host), so the margin stays a quarter.
- It runs on its own thread and takes no lock a store call holds: the heartbeat thread may
  be stuck in a store call for as long as that call's deadline; the watchdog still fires.

The renewals themselves are recorded in one place, `controlplane.runtime.lease._lease.Renewals`
(which also says when this runtime may judge others dead); the watchdog reads its last success.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from controlplane.runtime.lease._lease import Renewals

__all__ = ["FENCE_AT", "OwnLease"]

log = logging.getLogger(__name__)

FENCE_AT: Final = 0.75
"""When the watchdog fences the runtime: this fraction of ``lease_ttl_s`` after the last
successful renewal was sent."""


class OwnLease:
    """This runtime's lease on its own monotonic clock, watched on a thread of its own.

    Args:
        runtime_id: The runtime's id (for the thread's name and the log).
        lease_ttl_s: The lease others judge this runtime by.
        renewals: The runtime's record of its renewals (`Renewals.last_renewed`).
        on_lapse: Called on the watchdog's thread with the reason (``lease lost: …``) once
            per lapse: no renewal sent in the last ``FENCE_AT * lease_ttl_s`` seconds
            succeeded. It must not block on the store.
        registered_at: When (on the clock) the runtime's row was sent, fresh: the lease
            until the first renewal.
        clock: The monotonic clock (seconds); shared by every process on one host.
        on_rearmed: Called (on the renewal's thread) when a renewal re-arms a lapsed
            lease: the runtime's fenced Tasks can be settled and new ones admitted now.
    """

    def __init__(
        self,
        runtime_id: str,
        lease_ttl_s: float,
        renewals: Renewals,
        on_lapse: Callable[[str], object],
        *,
        registered_at: float,
        clock: Callable[[], float] = time.monotonic,
        on_rearmed: Callable[[], object] | None = None,
    ) -> None:
        self._runtime_id = runtime_id
        self._ttl = lease_ttl_s
        self._fence_after = lease_ttl_s * FENCE_AT
        self._renewals = renewals
        self._on_lapse = on_lapse
        self._registered_at = registered_at
        self._clock = clock
        self._on_rearmed = on_rearmed
        self._changed = threading.Condition(threading.Lock())
        self._lost_at: float | None = None  # the store said the lease is gone, then
        self._lapsed = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def _last_ok(self) -> float:
        """When the last renewal that succeeded was sent (-inf once the store said the
        lease is gone, until a renewal sent later succeeds)."""
        last = self._renewals.last_renewed
        last = self._registered_at if last is None else max(last, self._registered_at)
        if self._lost_at is not None:
            if last <= self._lost_at:
                return float("-inf")
            self._lost_at = None
        return last

    # -- the renewals (the heartbeat thread) --------------------------------------------

    def renewed(self) -> None:
        """A renewal succeeded (recorded in `Renewals`). It re-arms a lapsed lease only if
        it was sent recently enough to hold the lease for a while yet."""
        with self._changed:
            rearmed = False
            if self._clock() < self._last_ok() + self._fence_after:
                rearmed, self._lapsed = self._lapsed, False
            self._changed.notify_all()
        if rearmed and self._on_rearmed is not None:
            self._on_rearmed()

    def lose(self, why: str) -> None:
        """Fence now: the store says this runtime's lease is gone (its row closed)."""
        with self._changed:
            self._lost_at = self._clock()
            self._changed.notify_all()
        log.error("runtime %s: %s", self._runtime_id, why)

    @property
    def lapsed(self) -> bool:
        """Whether the watchdog fenced the runtime and no renewal has re-armed it since."""
        return self._lapsed

    @property
    def deadline(self) -> float:
        """When (on the clock) the watchdog fences the runtime unless a renewal succeeds."""
        with self._changed:
            return self._last_ok() + self._fence_after

    # -- the watchdog -------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog thread (a daemon: it holds nothing a crash would lose)."""
        self._thread = threading.Thread(
            target=self._watch, name=f"subagent-lease-watchdog:{self._runtime_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog; it fires no more."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        while True:
            with self._changed:
                while True:
                    if self._stopped:
                        return
                    last_ok = self._last_ok()
                    left = last_ok + self._fence_after - self._clock()
                    if left <= 0 and not self._lapsed:
                        break
                    # Lapsed already: sleep until a renewal re-arms it (or the stop).
                    self._changed.wait(left if left > 0 else None)
                self._lapsed = True
            self._fire(last_ok)

    def _fire(self, last_ok: float) -> None:
        if last_ok == float("-inf"):
            silence = "(its row in the store is closed)"
        else:
            # The send time on the monotonic clock, which every process on the host
            # shares: a log line to set beside another process's.
            silence = (
                f"for {self._clock() - last_ok:.2f}s (the last renewal that succeeded was "
                f"sent at {last_ok:.3f} on the monotonic clock)"
            )
        reason = (
            f"lease lost: runtime {self._runtime_id} could not renew its lease {silence}; "
            f"its activations were stopped before the lease ({self._ttl:g}s) could lapse "
            "for the other runtimes"
        )
        try:
            self._on_lapse(reason)
        except Exception:  # the watchdog must outlive a bug in what it calls
            log.exception("runtime %s: fencing after a lost lease failed", self._runtime_id)
        log.warning("runtime %s: %s", self._runtime_id, reason)
