"""SPEC §9 "Outages": a store outage shorter than the retry budget (`RetryPolicy.max_total_s`,
20 s by default) loses and fails nothing — appends, steers and turns wait and go on.

The outage is real: a private PostgreSQL server (`pg_fault.PostgresServer`) crashed with
``pg_ctl stop -m immediate`` and started again. Before the budget was a time (it was 8
attempts, ~0.8 s of waits), a 2 s restart failed the append (`STORE_UNAVAILABLE`), the
steer (`DURABILITY_FAILED`) and the running turn.
"""

from __future__ import annotations

import threading
import time

import pytest

from controlplane import EventKind, MessageSource, SubagentControl, TaskStatus
from persistence import RetryPolicy, SqlStore
from tests.fakes import FakeProvider
from tests.persistence.conftest import new_child
from tests.reliability.pg_fault import PostgresServer
from tests.support import WAIT_S, events, in_thread, inbound, kinds, running_child, text

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

OUTAGE_S = 2.0
"""Longer than the old count bound's waits (8 attempts: ~0.64 s on average, 1.27 s at
most), far shorter than the default 20 s budget."""


def _outage(server: PostgresServer, first_retry: threading.Event) -> None:
    """The server is down (crashed); once a store call is retrying, it stays down for
    `OUTAGE_S` in all, then starts again."""
    assert first_retry.wait(WAIT_S), "no store call retried while the server was down"
    time.sleep(OUTAGE_S)  # the outage's length, not a synchronisation
    server.start()


def test_an_append_rides_through_a_server_restart_with_the_default_budget(
    pg_server: PostgresServer,
) -> None:
    retried = threading.Event()
    policy = RetryPolicy(on_retry=lambda _attempt, _error: retried.set())
    assert policy.max_total_s >= 20
    with SqlStore(pg_server.new_database(), retry=policy) as store:
        meta = new_child(store)
        pg_server.crash()
        appended = in_thread(
            lambda: store.append(meta.child_id, [{"kind": "note", "turn": 1, "data": {"n": 1}}])
        )
        _outage(pg_server, retried)
        stored = appended.result(timeout=30)
        assert [event.seq for event in stored] == [1]
        assert [event.data for event in store.load(meta.child_id).events] == [{"n": 1}]


def test_a_steer_and_a_turn_ending_during_a_restart_are_delivered_and_settled(
    pg_server: PostgresServer,
) -> None:
    retried = threading.Event()
    provider = FakeProvider()
    control = SubagentControl.open(
        pg_server.new_database(), retry=RetryPolicy(on_retry=lambda _n, _e: retried.set())
    )
    try:
        control.providers.register(provider)
        parent = control.agents.register("parent")
        gate = threading.Event()
        child_id, task_id, _plan = running_child(control, parent, provider, gate)
        pg_server.crash()
        steer = in_thread(
            lambda: control.send_message(
                parent, child_id, text("also this"), MessageSource(kind="human")
            )
        )
        _outage(pg_server, retried)
        result = steer.result(timeout=30)
        assert (result.route, result.task_id) == ("steered", task_id)
        pg_server.crash()
        retried.clear()
        gate.set()  # the turn ends while the store is down: its turn/end and settlement wait
        _outage(pg_server, retried)
        snapshot = control.tasks.wait(task_id, timeout=30, requester=parent)
        assert snapshot.status is TaskStatus.COMPLETED, snapshot
        stored = events(control, child_id)
        assert len(inbound(stored, "also this")) == 1
        assert kinds(stored).count(EventKind.TURN_END) == 1
        assert kinds(stored)[-1] == EventKind.TURN_END
    finally:
        control.close()
