"""SPEC §9 "Outages", in one runtime: a PostgreSQL restart longer than the store's retry
budget (a private server, `pg_fault.PostgresServer`, crashed and started again).

- A turn ending while the server is down: its Task ends ``interrupted`` (never failed),
  its claim is held, and once the server is back its settlement closes the turn
  (``turn/end`` status ``interrupted``) before any later turn begins. Before, the Task read
  ``failed``/``DURABILITY_FAILED``, the settlement was written alone once the server was
  back, releasing the claim, and the next resume opened turn 2 on top of the open turn 1.
- A local steer whose record cannot be written: ``DURABILITY_FAILED`` (the run has it), never
  ``NOT_DELIVERED`` or ``STORE_UNAVAILABLE``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from controlplane import AgentHandle, ErrorCode, EventKind, SubagentControl, TaskStatus
from persistence import RetryPolicy
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import PostgresServer
from tests.reliability.transcripts import frame_problems, turns_of
from tests.support import events, eventually, raises, running_child, settle, text

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

OUTAGE_S = 1.5
BUDGET_S = 0.3
"""The store's retry budget: shorter than the outage."""
LEASE_S = 1.5
"""The heartbeat (every third of it) retries refused settlements."""


@dataclass
class Turn:
    """A control plane on a fresh database of the private server, with one running child
    whose turn ends when ``gate`` is set."""

    control: SubagentControl
    provider: FakeProvider
    parent: AgentHandle
    gate: threading.Event
    child_id: str
    task_id: str


@pytest.fixture
def turn(pg_server: PostgresServer) -> Iterator[Turn]:
    provider = FakeProvider()
    control = SubagentControl.open(
        pg_server.new_database(), retry=RetryPolicy(max_total_s=BUDGET_S), lease_ttl_s=LEASE_S
    )
    with control:
        control.providers.register(provider)
        parent = control.agents.register("parent")
        gate = threading.Event()
        child_id, task_id, _ = running_child(control, parent, provider, gate)
        try:
            yield Turn(control, provider, parent, gate, child_id, task_id)
        finally:
            if not pg_server.is_up():  # a test failing mid-outage leaves the server up
                pg_server.start()


def test_a_turn_ending_during_a_restart_longer_than_the_budget_is_interrupted_and_closed_once_back(
    pg_server: PostgresServer, turn: Turn
) -> None:
    control, parent, gate = turn.control, turn.parent, turn.gate
    child_id, task_id = turn.child_id, turn.task_id
    pg_server.crash()
    gate.set()  # the turn ends while the server is down

    snapshot = settle(control, task_id, parent)

    assert snapshot.status is TaskStatus.INTERRUPTED, snapshot
    assert snapshot.outcome is not None
    assert snapshot.outcome.code is ErrorCode.STORE_UNAVAILABLE
    time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
    pg_server.start()
    ledger = control.store.ledger if control.store is not None else None
    assert ledger is not None
    eventually(  # the heartbeat writes it, with the turn's end
        lambda: (ledger.get(task_id) or snapshot).status is TaskStatus.INTERRUPTED,
        "the interrupted settlement is in the store",
    )
    stored = events(control, child_id)
    assert stored[-1].kind == EventKind.TURN_END
    assert stored[-1].data == {"task_id": task_id, "status": "interrupted"}
    again = control.send_message(parent, child_id, text("go on"))
    assert settle(control, again.task_id, parent).status is TaskStatus.COMPLETED
    stored = events(control, child_id)
    assert frame_problems(stored, all_ended=True) == []
    assert [ended.task_id for ended in turns_of(stored)] == [task_id, again.task_id]


def test_a_local_steer_whose_record_cannot_be_written_during_a_restart_is_durability_failed(
    pg_server: PostgresServer, turn: Turn
) -> None:
    control, parent, gate = turn.control, turn.parent, turn.gate
    child_id, task_id, provider = turn.child_id, turn.task_id, turn.provider
    pg_server.crash()
    with raises(ErrorCode.DURABILITY_FAILED):
        control.send_message(parent, child_id, text("kept by the run"))
    assert provider.steered_texts(child_id) == ["kept by the run"]
    pg_server.start()
    gate.set()
    assert settle(control, task_id, parent).status.is_terminal
