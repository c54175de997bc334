"""Issue 36, break 1: a fenced runtime must not wedge its children once the store is back.

Runtime A reaches a private PostgreSQL through a `pg_fault.TcpProxy`; its child's model
answers while the proxy holds A's traffic, so the write of that answer is abandoned when A's
lease watchdog fences it. The hold ends before A's lease lapses: A renews normally again,
alive in every other runtime's eyes. Runtime S, connected directly and sending only to A's
child (no self-sends), must then get its message taken — A writes the fenced Task's
settlement and its turn's end once the store answers, releasing the child.

Before: the abandoned write closed the turn's writer, its close then returned silently, the
settlement counted as written with the turn's end, and A kept the claim: every send from S
was refused ``NOT_DELIVERED`` until A exited, and the store kept the Task ``running``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane import EventKind, TaskStatus
from persistence import SqlStore
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.processes import LinesProcess, Reaper, reaping

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).with_name("partition_child.py")
LEASE_S = 3.0
SEND_FOR_S = 4 * LEASE_S
"""How long S keeps sending: a flush of A's settlement is due within a renewal period of
its store coming back (a third of the lease); this allows several."""

reaped = pytest.fixture(reaping, name="reaped")


def test_a_fenced_runtime_releases_its_child_once_the_store_is_back(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    reaped: Reaper,
    tmp_path: Path,
) -> None:
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
    proxy.hold()
    try:
        trigger.touch()  # the model answers: the write of its answer meets the partition
        a.say("wait")
        waited = json.loads(a.expect("WAITED ", timeout_s=LEASE_S * 4))
    finally:
        proxy.release()  # before A's lease could lapse: A lives on, and renews
    assert waited.get("status") == TaskStatus.INTERRUPTED.value, waited

    s = reaped.add(
        LinesProcess(
            SCRIPT, "S", url, str(LEASE_S), str(log), ready["child_id"], str(SEND_FOR_S),
            name="runtime S", stderr=tmp_path / "s.err",
        )
    )  # fmt: skip
    sent = json.loads(s.expect("SENT ", timeout_s=SEND_FOR_S * 3))
    assert sent["route"] == "started", (sent, a.stderr()[-2000:])
    assert sent["status"] == TaskStatus.COMPLETED.value, sent
    a.say("close")
    a.expect("CLOSED ", timeout_s=LEASE_S * 4)

    with SqlStore(url) as store:
        fenced = store.ledger.get(ready["task_id"])
        events = store.load(ready["child_id"]).events
    assert fenced is not None
    assert fenced.status is TaskStatus.INTERRUPTED, fenced
    ends = [e for e in events if e.kind == EventKind.TURN_END]
    assert [e.data["status"] for e in ends] == ["interrupted", "completed"]
