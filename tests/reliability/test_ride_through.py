"""SPEC §9 "Outages": a store outage of half the lease, whatever its phase against the
renewals, is ridden through: no running Task is fenced.

The outage is a `pg_fault.TcpProxy` holding every byte both ways between one runtime and
a private server, for half of a 3 s lease, starting at several offsets after a renewal was
sent. Before the renewals were retried (one renewal a third of the lease, a deadline of a
third, the fence at two thirds after the last success), a renewal caught by the hold used
its whole deadline, the next went out exactly at the fence, and an outage of 1.5 s that
began more than half a period after a renewal fenced every running Task.

The kernel's own faults (packets dropped, not held) are in `test_kernel_faults.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from controlplane import SubagentControl, TaskStatus
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.support import WAIT_S, eventually, running_child

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE_S = 3.0
OUTAGE_S = LEASE_S / 2
PHASES = (0.05, 0.2, 0.3)
"""When each outage begins, after a renewal was sent, in leases (the old period was ⅓)."""


def _renewal_sent(control: SubagentControl) -> float:
    """Wait for the next successful renewal; when (monotonic) it was sent."""
    renewals = control._runtime.renewals  # type: ignore[union-attr]
    before = renewals.last_renewed
    eventually(lambda: renewals.last_renewed != before, "a renewal succeeds", LEASE_S * 2)
    sent = renewals.last_renewed
    assert sent is not None
    return sent


@pytest.mark.parametrize("phase", PHASES)
def test_an_outage_of_half_the_lease_fences_nothing_whatever_its_phase(
    pg_server: PostgresServer, tcp_proxy_factory: Callable[[int], TcpProxy], phase: float
) -> None:
    proxy = tcp_proxy_factory(pg_server.port)
    control = SubagentControl.open(proxy.url(pg_server.new_database()), lease_ttl_s=LEASE_S)
    try:
        provider = FakeProvider()
        control.providers.register(provider)
        parent = control.agents.register("parent")
        gate = threading.Event()
        child_id, task_id, _plan = running_child(control, parent, provider, gate)
        sent = _renewal_sent(control)
        pause = sent + phase * LEASE_S - time.monotonic()
        assert pause > 0, "the test could not start the outage at its phase"
        time.sleep(pause)  # the outage's phase, not a synchronisation
        proxy.hold()
        try:
            time.sleep(OUTAGE_S)  # the outage itself
        finally:
            proxy.release()
        # A lease after the heal, it has renewed and never fenced.
        _renewal_sent(control)
        assert control.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING
        assert not control._heartbeat.lease.lapsed  # type: ignore[union-attr]
        gate.set()
        done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert child_id
    finally:
        control.close()
