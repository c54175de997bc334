"""An outage of half the lease is ridden through, whatever its phase against the renewals,
also while the store's calls that were in flight in it stay stuck past the heal.

Dropped packets (not a proxy that releases held bytes at once) leave the calls caught in
an outage in TCP's retransmission backoff well past the heal, holding their pooled
connections until their deadlines. The renewals took their connections from the same
pool: once it was taken, each renewal queued for a connection behind the stuck calls, and
a runtime whose outage was half its lease fenced itself (the kernel stress run: after
each of p1's 2 s one-way drops, on a 4 s lease). Here a `pg_fault.TcpProxy` holds every
byte for half of a 3 s lease, and every connection the pool may open is held (as calls
stuck in retransmission would) from the outage's start until half a lease after it heals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from controlplane import SubagentControl, TaskStatus
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.test_ride_through import LEASE_S, OUTAGE_S, _renewal_sent
from tests.support import WAIT_S, running_child

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PHASES = (0.05, 0.3)
"""When each outage begins, after a renewal was sent, in leases."""

STUCK_AFTER_HEAL_S = LEASE_S / 2
"""How long the pool stays taken after the heal (calls in TCP's retransmission backoff)."""


@pytest.mark.parametrize("phase", PHASES)
def test_an_outage_of_half_the_lease_with_the_pool_taken_fences_nothing(
    pg_server: PostgresServer, tcp_proxy_factory: Callable[[int], TcpProxy], phase: float
) -> None:
    proxy = tcp_proxy_factory(pg_server.port)
    control = SubagentControl.open(proxy.url(pg_server.new_database()), lease_ttl_s=LEASE_S)
    held: list[Any] = []
    try:
        provider = FakeProvider()
        control.providers.register(provider)
        parent = control.agents.register("parent")
        gate = threading.Event()
        _child_id, task_id, _plan = running_child(control, parent, provider, gate)
        engine = control._store._db.engine  # type: ignore[union-attr]
        pool: Any = engine.pool
        sent = _renewal_sent(control)
        pause = sent + phase * LEASE_S - time.monotonic()
        assert pause > 0, "the test could not start the outage at its phase"
        time.sleep(pause)  # the outage's phase, not a synchronisation
        # Every connection the pool may hand out is taken, as by calls stuck in the outage.
        while pool.checkedout() < pool.size() + pool._max_overflow:
            held.append(engine.raw_connection())
        proxy.hold()
        try:
            time.sleep(OUTAGE_S)  # the outage itself
        finally:
            proxy.release()
        time.sleep(STUCK_AFTER_HEAL_S)  # the stuck calls' retransmission, not a sync
        lapsed = control._heartbeat.lease.lapsed  # type: ignore[union-attr]
        for conn in held:
            conn.close()
        held.clear()
        _renewal_sent(control)
        assert not lapsed, "the runtime fenced itself"
        assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING
        gate.set()
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
    finally:
        for conn in held:
            conn.close()
        control.close()
