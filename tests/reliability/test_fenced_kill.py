"""SPEC §9 "Lease safety": an activation killed while a write waits on a silent network is
still abandoned when its runtime fences itself.

The kernel-fault stress run (issue 36) counted 6 double activations on one child: runtime
p1's activation sat in a transcript write caught by a one-way DROP partition, and lived
4.2 s past p1's own fence, while the runtimes that took the child over entered it. The
fence abandons the waits of an activation whose signal it aborts; a signal aborted
before (a kill, whose first reason wins) was never marked fenced, so the write waited
for the partition to heal (TCP's retransmission) or the store's silence bound (statement
timeout + 2 s). Here the partition (a `pg_fault.TcpProxy` holding every byte) lands as
the model's answer is written, the Task is killed while that write waits, and the write
must end within the quarter of the lease an activation has to stop in after the fence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)
from persistence import SqlStore
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.support import WAIT_S

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE_S = 3.0
STOP_IN_S = LEASE_S / 4
"""How long after its runtime fenced an activation may still be in a store call."""
CLOSE_S = 2 * LEASE_S + 2.0
"""As `test_partition.CLOSE_S`: a lease for the heartbeat, one for the activations, slack."""


class _FenceClock(logging.Handler):
    """When the runtime's lease watchdog logged "lease lost" (`time.monotonic`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.fenced_at: float | None = None
        self.fenced = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "lease lost" in record.getMessage() and self.fenced_at is None:
            self.fenced_at = time.monotonic()
            self.fenced.set()


@pytest.fixture
def fence_clock() -> Iterator[_FenceClock]:
    clock = _FenceClock()
    watched = logging.getLogger("controlplane.runtime.lease._own_lease")
    watched.addHandler(clock)
    try:
        yield clock
    finally:
        watched.removeHandler(clock)


def test_a_killed_activations_write_on_a_silent_network_is_abandoned_at_the_fence(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
    fence_clock: _FenceClock,
) -> None:
    proxy = tcp_proxy_factory(pg_server.port)
    armed, writing, ended = threading.Event(), threading.Event(), threading.Event()
    ended_at: list[float] = []
    append = SqlStore.append

    def append_into_the_partition(store: SqlStore, *args: Any, **kwargs: Any) -> Any:
        if not armed.is_set() or writing.is_set():
            return append(store, *args, **kwargs)
        proxy.hold()  # the partition lands as the answer's write goes out
        writing.set()
        try:
            return append(store, *args, **kwargs)
        finally:
            ended_at.append(time.monotonic())
            ended.set()

    monkeypatch.setattr(SqlStore, "append", append_into_the_partition)
    model = ScriptedModel(["answered during the partition"], gated=True)
    control = SubagentControl.open(proxy.url(pg_server.new_database()), lease_ttl_s=LEASE_S)
    try:
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register("parent")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="killed in the partition",
                prompt=[TextBlock(text="go")], parent=parent,
            )
        )  # fmt: skip
        armed.set()
        model.release()  # its answer is written: the write meets the partition
        assert writing.wait(WAIT_S), "the answer was never written"
        control.tasks.kill(started.task_id, requester=parent)  # the kill's reason wins
        assert fence_clock.fenced.wait(LEASE_S * 2), "the runtime never fenced itself"
        assert ended.wait(LEASE_S * 3), "the killed activation's write outlived the fence"
        assert fence_clock.fenced_at is not None
        late = ended_at[0] - fence_clock.fenced_at
        assert late < STOP_IN_S, f"the write ended {late:.2f}s after the fence"
    finally:
        began = time.monotonic()
        control.close()
        closed_in = time.monotonic() - began
        proxy.release()
    assert closed_in < CLOSE_S, f"close took {closed_in:.1f}s"
