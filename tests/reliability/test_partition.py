"""SPEC §9 "Lease safety" across processes: a runtime partitioned from PostgreSQL stops
acting before another runtime may take its child over, and says so itself.

Runtime A (`partition_child.py A`) reaches a private server (`pg_fault.PostgresServer`)
through a `pg_fault.TcpProxy`; its child is in a long tool call that acts every 20 ms. The
proxy holds A's traffic both ways (connections open, nothing passes, the proxy's kernel
still acknowledging: only a client-side deadline notices). Runtime B (`partition_child.py
B`), connected directly, takes the child over once A's lease has lapsed in the store. All
acts are stamped on the host's monotonic clock, which the processes share.

Before A fenced itself, its tool went on acting after B took the child over, and its own
`tasks.wait` never answered (the Task still running for A while the store said
``interrupted``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane import EventKind, TaskStatus
from persistence import SqlStore
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.processes import LinesProcess, Reaper, reaping

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("partition_child.py")
LEASE_S = 3.0
FENCE_AT = 0.75
"""When a runtime fences itself: this fraction of the lease after its last successful
renewal was sent (docs/reliability.md, "Partitions")."""
SCHEDULING_S = 0.5
"""How late a loaded host may wake the watchdog past its deadline (two cores shared by
several test runs); still far inside the last third of the lease."""
CLOSE_S = 2 * LEASE_S + 2.0
"""A's close while the partition holds: a lease for the heartbeat thread to come back
(it is left behind after that), a lease for the activations (close_timeout_s), and slack."""

reaped = pytest.fixture(reaping, name="reaped")


def acts(log: Path) -> list[tuple[str, str, float]]:
    rows = []
    for line in log.read_text().splitlines():
        role, what, at = line.split()
        rows.append((role, what, float(at)))
    return rows


def _partition_and_take_over(
    a: LinesProcess,
    proxy: TcpProxy,
    url: str,
    log: Path,
    ready: dict[str, str],
    reaped: Reaper,
    once_held: Callable[[], object] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Hold A's traffic, ask A for its Task's end, let runtime B take the child over, close
    A while the partition holds, and release it: A's answer, B's, and how long A's close
    took."""
    proxy.hold()
    try:
        if once_held is not None:
            once_held()
        a.say("wait")
        waited = json.loads(a.expect("WAITED ", timeout_s=LEASE_S * 4))
        b = reaped.add(
            LinesProcess(
                SCRIPT, "B", url, str(LEASE_S), str(log), ready["child_id"], ready["runtime"],
                name="runtime B", stderr=log.with_name("b.err"),
            )
        )  # fmt: skip
        took = json.loads(b.expect("TOOK ", timeout_s=LEASE_S * 6))
        a.say("close")
        closed_in = float(a.expect("CLOSED ", timeout_s=CLOSE_S * 2))
    finally:
        proxy.release()
    return waited, took, closed_in


def test_a_partitioned_runtime_stops_acting_before_its_child_is_taken_over_and_says_interrupted(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    reaped: Reaper,
    tmp_path: Path,
) -> None:
    url = pg_server.new_database()
    proxy = tcp_proxy_factory(pg_server.port)
    log = tmp_path / "acts.log"
    a = reaped.add(
        LinesProcess(
            SCRIPT, "A", proxy.url(url), str(LEASE_S), str(log),
            name="runtime A", stderr=tmp_path / "a.err",
        )
    )  # fmt: skip
    ready = json.loads(a.expect("READY "))
    waited, took, closed_in = _partition_and_take_over(a, proxy, url, log, ready, reaped)

    # A's own answer is the store's: interrupted, because its lease was lost.
    assert waited.get("status") == TaskStatus.INTERRUPTED.value, waited
    assert "interrupted" in waited["outcome"]["detail"]
    assert "lease lost" in waited["outcome"]["detail"]
    with SqlStore(url) as store:
        stored = store.ledger.get(ready["task_id"])
    assert stored is not None
    assert stored.status is TaskStatus.INTERRUPTED, stored
    # B took the child over and ran it.
    assert took == {"route": "started", "task_id": took["task_id"], "status": "completed"}

    rows = acts(log)
    (fenced,) = [at for role, what, at in rows if (role, what) == ("A", "fenced")]
    takeover = [at for role, what, at in rows if (role, what) == ("B", "takeover")][-1]
    a_acts = [(w, at) for role, w, at in rows if role == "A" and w not in ("fenced", "settled")]
    assert a_acts, "A's child never acted"
    # A acted on nothing after it fenced itself, which was before B could take over.
    assert all(at < fenced for _what, at in a_acts), (fenced, a_acts[-3:])
    assert fenced < takeover
    # And it fenced itself on time: at its watchdog's deadline (`FENCE_AT` of the lease
    # after the last renewal it sent that succeeded, which was before the hold), not later.
    # The whole log, not its tail: the failed renewals' lines after the fence would hide it.
    logged = (tmp_path / "a.err").read_text(encoding="utf-8")
    match = [line for line in logged.splitlines() if "on the monotonic clock" in line]
    assert match, a.stderr()
    last_renewal = float(match[0].split("sent at ")[1].split()[0])
    assert fenced <= last_renewal + FENCE_AT * LEASE_S + SCHEDULING_S
    assert fenced < last_renewal + LEASE_S
    # A's threads were not hung: close returned while the partition still held.
    assert closed_in < CLOSE_S, f"A's close took {closed_in}s"


def test_a_partitioned_runtime_abandons_a_write_stuck_on_the_silent_network_when_it_fences(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    reaped: Reaper,
    tmp_path: Path,
) -> None:
    """A's model answers while the proxy holds: the loop's write of the answer waits on a
    connection that will never answer. Fencing abandons that write at once, so A's Task
    settles (its activation quiescent, its run disposed) before B may take the child over,
    not after the store's own silence bound (statement timeout + 2 s, and retries).

    Before: A's wait still had no answer after three leases (``TIMEOUT``), its activation
    alive while B ran the child (the restart stress run's lock probe saw both)."""
    url = pg_server.new_database()
    proxy = tcp_proxy_factory(pg_server.port)
    log, trigger = tmp_path / "acts.log", tmp_path / "answer"
    a = reaped.add(
        LinesProcess(
            SCRIPT, "A", proxy.url(url), str(LEASE_S), str(log), str(trigger),
            name="runtime A", stderr=tmp_path / "a.err",
        )
    )  # fmt: skip
    ready = json.loads(a.expect("READY "))
    # The model answers once the proxy holds: the answer's write meets the partition.
    waited, took, _closed_in = _partition_and_take_over(
        a, proxy, url, log, ready, reaped, once_held=trigger.touch
    )

    assert waited.get("status") == TaskStatus.INTERRUPTED.value, waited
    assert "lease lost" in waited["outcome"]["detail"]
    assert (took["route"], took["status"]) == ("started", "completed"), took
    rows = acts(log)
    (settled,) = [at for role, what, at in rows if (role, what) == ("A", "settled")]
    takeover = [at for role, what, at in rows if (role, what) == ("B", "takeover")][-1]
    assert settled < takeover, (settled, takeover)
    with SqlStore(url) as store:
        stored = store.load(ready["child_id"]).events
    answered = [e for e in stored if e.kind == EventKind.ASSISTANT_MESSAGE]
    assert not [e for e in answered if e.data["text"] == "answered during the partition"]
