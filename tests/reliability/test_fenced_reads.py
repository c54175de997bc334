"""SPEC §9 "Lease safety": every store call on an activation's path is abandoned when its
runtime fences it, reads included.

The partition lands during the budget gate's read of the spend (`SpendLedger.chain_and_rows`,
the turn's first check, on the agent loop's thread before its first model call; later
checks read the rows the turn's own appends leave): a `pg_fault.TcpProxy` between the
runtime and a private server starts holding every byte just as that read goes out. Before
the gate's reads were abandoned like the transcript's writes, the activation sat in the
read past the fence: its Task's own `wait` timed out instead of answering ``interrupted``,
and `close()` took 34.6 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from controlplane import (
    Budget,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall
from controlplane.runtime.lease._renewer import ATTEMPT_BOUND
from persistence._spend import SpendLedger
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.support import WAIT_S

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE_S = 3.0
CLOSE_S = 2 * LEASE_S + 2.0
"""As `test_partition.CLOSE_S`: a lease for the heartbeat, one for the activations, slack."""


def test_a_gate_read_caught_by_a_partition_is_abandoned_when_the_runtime_fences(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = tcp_proxy_factory(pg_server.port)
    reading = threading.Event()
    read = SpendLedger.chain_and_rows

    def read_into_the_partition(ledger: SpendLedger, *args: Any, **kwargs: Any) -> Any:
        on_the_loop = threading.current_thread().name.startswith("subagent-loop")
        if on_the_loop and not reading.is_set():
            proxy.hold()  # the partition lands as this read goes out
            reading.set()
        return read(ledger, *args, **kwargs)

    monkeypatch.setattr(SpendLedger, "chain_and_rows", read_into_the_partition)
    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCall(id="c1", name="work", arguments={})]), "done"],
        gated=True,
    )
    tool = ChildTool("work", "Work.", {"type": "object"}, lambda _args: "worked")
    control = SubagentControl.open(proxy.url(pg_server.new_database()), lease_ttl_s=LEASE_S)
    try:
        control.providers.register(InProcessProvider(model, tools=[tool]))
        parent = control.agents.register("parent")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="gated", prompt=[TextBlock(text="go")],
                parent=parent, budget=Budget(tokens=1_000_000),
            )
        )  # fmt: skip
        assert reading.wait(WAIT_S), "the gate never read the spend"
        waited = control.tasks.wait(started.task_id, timeout=LEASE_S * 3, requester=parent)
        assert waited.status is TaskStatus.INTERRUPTED, waited
        assert waited.outcome is not None
        assert "lease lost" in waited.outcome.detail
    finally:
        began = time.monotonic()
        control.close()
        closed_in = time.monotonic() - began
        proxy.release()
    assert closed_in < CLOSE_S, f"close took {closed_in:.1f}s"


def _close_during_a_held_call(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    method: str,
    thread_prefix: str,
) -> tuple[float, list[float], float]:
    """Open a plane through a proxy, hold the proxy (a silent network) as ``owner.method``
    next goes out on a thread named ``thread_prefix…``, then close the plane: when close
    began, when that call ended (if it did), how long close took."""
    proxy = tcp_proxy_factory(pg_server.port)
    calling = threading.Event()
    ended: list[float] = []
    call = getattr(owner, method)

    def into_the_partition(self: Any) -> Any:
        on_its_thread = threading.current_thread().name.startswith(thread_prefix)
        if not on_its_thread or calling.is_set():
            return call(self)
        proxy.hold()  # the partition lands as this call goes out
        calling.set()
        try:
            return call(self)
        finally:
            ended.append(time.monotonic())

    control = SubagentControl.open(proxy.url(pg_server.new_database()), lease_ttl_s=LEASE_S)
    try:
        monkeypatch.setattr(owner, method, into_the_partition)
        assert calling.wait(WAIT_S), f"{owner.__name__}.{method} never ran on its thread"
    finally:
        began = time.monotonic()
        control.close()
        closed_in = time.monotonic() - began
        proxy.release()
    return began, ended, closed_in


def test_close_gives_up_the_heartbeats_store_call_caught_by_a_partition(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Close waited for the heartbeat thread's store call stuck on the silent network to
    # run to its deadline (a lease), then spent a lease more on its own writes: close
    # took two leases and more (8.7 s once in this file's first test, bound 8 s).
    from controlplane.runtime.lease._runtime import Runtime

    began, ended, closed_in = _close_during_a_held_call(
        pg_server, tcp_proxy_factory, monkeypatch, Runtime, "sweep", "subagent-runtime:"
    )
    # Given up as close began (before: it ran to its deadline, a lease after it began).
    assert ended
    assert ended[0] - began < LEASE_S / 2, f"the sweep ended {ended[0] - began:.1f}s in"
    assert closed_in < LEASE_S * (1 + ATTEMPT_BOUND) + 1.0, f"close took {closed_in:.1f}s"


def test_close_gives_up_the_approvals_sweeps_store_call_caught_by_a_partition(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The approvals' sweep stuck on the silent network went on retrying after close had
    # returned (its thread left behind, a daemon), for as long as its retries lasted.
    from persistence._approvals import ApprovalBook

    began, ended, _ = _close_during_a_held_call(
        pg_server, tcp_proxy_factory, monkeypatch, ApprovalBook, "waiting", "subagent-approvals:"
    )
    # Given up as close began (before: still retrying when close returned).
    assert ended
    assert ended[0] - began < LEASE_S / 2, f"the sweep ended {ended[0] - began:.1f}s in"
