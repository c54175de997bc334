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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane import (
    CancelSignal,
    EventKind,
    InProcessProvider,
    SubagentControl,
    TaskStatus,
)
from controlplane.models import ModelReply, ModelRequest
from persistence import SqlStore
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.processes import LinesProcess, Reaper, reaping

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).with_name("partition_child.py")
PARENT = "partition-parent"
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


class _HeldModel:
    """The recovering runtime's model: its first call waits for ``go`` (bounded)."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.go = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        del request
        self.called.set()
        self.go.wait(LEASE_S * 20)
        signal.raise_if_aborted()
        return ModelReply(text="recovered elsewhere")


def test_a_fenced_runtime_back_from_a_partition_leaves_a_recovered_task_alone(
    pg_server: PostgresServer,
    tcp_proxy_factory: Callable[[int], TcpProxy],
    reaped: Reaper,
    tmp_path: Path,
) -> None:
    """A is cut off past its lease; runtime R (this process, with the provider) recovers
    A's Task and is mid-turn when A's store comes back and A flushes the settlement it
    fenced. That flush must not settle R's running Task nor take its claim: the same Task
    completes in R, one ``turn/end`` for its turn."""
    url = pg_server.new_database()
    proxy = tcp_proxy_factory(pg_server.port)
    log = tmp_path / "acts.log"
    model = _HeldModel()
    with SubagentControl.open(url, lease_ttl_s=LEASE_S) as survivor:
        survivor.providers.register(InProcessProvider(model))
        parent = survivor.agents.register(PARENT)
        a = reaped.add(
            LinesProcess(
                SCRIPT, "A", proxy.url(url), str(LEASE_S), str(log),
                name="runtime A", stderr=tmp_path / "a.err",
            )
        )  # fmt: skip
        ready = json.loads(a.expect("READY "))
        proxy.hold()
        try:
            assert model.called.wait(LEASE_S * 10), "R never recovered A's Task"
        finally:
            proxy.release()
        assert survivor.store is not None
        store = survivor.store
        # A renews again, and flushes its fenced settlement right after each renewal.
        renewed = [_heartbeat(store, ready["runtime"])]
        deadline = time.monotonic() + LEASE_S * 10
        while len(set(renewed)) < 3:
            assert time.monotonic() < deadline, "A never renewed after the partition"
            survivor_wait = threading.Event()
            survivor_wait.wait(0.05)
            renewed.append(_heartbeat(store, ready["runtime"]))
        # A's own answer follows the store for the Task it no longer holds, once its
        # store is back: running, in R (not the `interrupted` it settled at its fencing).
        got = _got_until(a, lambda snap: snap["status"] != TaskStatus.INTERRUPTED.value)
        assert got["status"] == TaskStatus.RUNNING.value, got
        assert got["runtime_id"] == survivor.runtime_id, got
        model.go.set()
        done = survivor.tasks.wait(ready["task_id"], timeout=LEASE_S * 10, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
        assert done.recoveries == 1
        events = store.load(ready["child_id"]).events
    ends = [e for e in events if e.kind == EventKind.TURN_END]
    assert [e.data["status"] for e in ends] == ["completed"]
    a.say("get")
    got = json.loads(a.expect("GOT "))
    assert got["status"] == TaskStatus.COMPLETED.value, got
    a.say("close")
    a.expect("CLOSED ", timeout_s=LEASE_S * 4)


def _got_until(a: LinesProcess, done: Callable[[dict[str, object]], bool]) -> dict[str, object]:
    """A's `tasks.get` of its Task, asked again (bounded) until ``done`` holds of it."""
    deadline = time.monotonic() + LEASE_S * 4
    while True:
        a.say("get")
        got: dict[str, object] = json.loads(a.expect("GOT "))
        if done(got) or time.monotonic() > deadline:
            return got
        threading.Event().wait(0.05)


def _heartbeat(store: SqlStore, runtime_id: str) -> object:
    row = store.ledger.runtime(runtime_id)
    return None if row is None else row.heartbeat_at
