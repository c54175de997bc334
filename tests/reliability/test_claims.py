"""SPEC §9 across processes: one activation per child whatever the interleaving, fencing of
a runtime that lost its claim, and takeover of a dead one's child.

Real OS processes on both backends (``claim_child.py``, ``restart_child.py``), signalled with
SIGKILL, SIGSTOP and SIGCONT; every process a test starts is reaped, pass or fail.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import (
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.fakes import FakeProvider
from tests.persistence.conftest import libpq_url
from tests.reliability.processes import Reaper, Sender, reaping
from tests.reliability.test_restarts import Child
from tests.support import WAIT_S, eventually, idle_child

PARENT = "claim-parent"
PROCESSES = 3
ROUNDS = 6

pytestmark = pytest.mark.slow

reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def _stop_between_writes(child: Child, url: str, name: str) -> None:
    """SIGSTOP ``child`` at a moment it is inside no write transaction. Stopped inside one,
    it keeps its locks until it continues or dies: on SQLite the whole database's write lock,
    so every other writer is locked out; on PostgreSQL the row locks of the child it was
    writing to, so the very takeover the test waits for cannot claim that child (a limit of
    the databases, not of the claims). Stopped inside one, it is let go on and stopped
    again. ``name`` is the application name in the child's URL (PostgreSQL)."""
    pause = threading.Event()
    for _ in range(100):
        child.proc.send_signal(signal.SIGSTOP)
        eventually(lambda: _state(child.proc.pid) == "T", "the child stopped")
        if _outside_transactions(url, name):
            return
        child.proc.send_signal(signal.SIGCONT)
        pause.wait(0.005)  # let it finish the write it was in
    pytest.fail("the child was inside a write transaction at each of 100 stops")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _named(url: str, name: str) -> str:
    """``url`` whose connections carry the application name ``name`` (PostgreSQL), so
    `_outside_transactions` can find them; a SQLite URL unchanged."""
    if url.startswith("sqlite"):
        return url
    return (
        sa.make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


def _outside_transactions(url: str, name: str) -> bool:
    """Whether the (stopped) process whose connections are named ``name`` holds no write
    transaction open: SQLite, the write lock is free; PostgreSQL, every connection of it is
    idle (not in a transaction, nor running a statement that may leave one open)."""
    if url.startswith("sqlite"):
        probe = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as admin:
        states = admin.execute(
            # The runtime's tag follows the URL's own name (`persistence._sessions`).
            "SELECT state FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"{name} %",),
        ).fetchall()
    assert states, f"no connection of {name} on the server"
    return all(state == "idle" for (state,) in states)


def _turns(events: list[SessionEvent]) -> dict[int, list[SessionEvent]]:
    turns: dict[int, list[SessionEvent]] = {}
    for event in events:
        if event.turn > 0:
            turns.setdefault(event.turn, []).append(event)
    return turns


def test_simultaneous_sends_from_three_processes_never_start_two_activations(
    url: str, reaped: Reaper
) -> None:
    with SubagentControl.open(url) as control:
        control.providers.register(FakeProvider())
        child = idle_child(control, control.agents.register(PARENT))
    senders = [reaped.add(Sender(url, child, f"p{i}")) for i in range(PROCESSES)]
    for sender in senders:
        assert sender.next_line().startswith("ready ")

    # On SQLite a send to the child another process runs is refused (OWNERSHIP_CONFLICT);
    # on PostgreSQL it is forwarded there: steered, or NOT_DELIVERED if the turn ended.
    refusals = {"OWNERSHIP_CONFLICT"} if url.startswith("sqlite") else {"NOT_DELIVERED"}
    outcomes: dict[str, str] = {}  # message text -> started | steered | refused <code>
    started_tasks: dict[str, str] = {}  # message text -> task id
    steered_tasks: dict[str, str] = {}
    for number in range(ROUNDS):
        for sender in senders:  # as close to simultaneous as three pipes allow
            sender.say(f"go {number}")
        for sender in senders:
            answer = sender.next_line()
            text = f"{sender.name}-{number}"
            if answer.startswith("started "):
                started_tasks[text] = answer.split()[1]
                assert sender.next_line() == "settled completed"
                outcomes[text] = "started"
            elif answer.startswith("steered ") and url.startswith("postgresql"):
                steered_tasks[text] = answer.split()[1]
                outcomes[text] = "steered"
            else:
                assert answer.removeprefix("refused ") in refusals, answer
                outcomes[text] = answer
    for sender in senders:
        sender.say("quit")
        assert sender.next_line() == "closed"

    with SubagentControl.open(url) as control:
        assert control.store is not None
        events = control.store.load(child).events
    turns = _turns(events)
    # One new turn per `started`, consecutive, each framed by exactly one start and end.
    assert sorted(turns) == list(range(1, 2 + len(started_tasks)))
    for number, turn in turns.items():
        kinds = [e.kind for e in turn]
        assert kinds.count(EventKind.TURN_START) == 1, (number, kinds)
        assert kinds.count(EventKind.TURN_END) == 1, (number, kinds)
        assert kinds[0] == EventKind.TURN_START
        assert kinds[-1] == EventKind.TURN_END
    opened_by = {turn[0].data["task_id"]: turn for turn in turns.values()}
    for text, outcome in outcomes.items():
        carrying = [
            e
            for e in events
            if e.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE)
            and e.data["text"] == text
        ]
        if outcome == "started":
            (message,) = carrying  # exactly once, in the turn its Task opened
            assert message.kind == EventKind.USER_MESSAGE
            assert message in opened_by[started_tasks[text]]
        elif outcome == "steered":
            (message,) = carrying  # exactly once, in the turn of the Task it names
            assert message.kind == EventKind.STEERING_MESSAGE
            assert message in opened_by[steered_tasks[text]]
        else:
            assert carrying == []  # refused: nowhere
    assert any(o == "started" for o in outcomes.values())


def test_a_stopped_owner_is_taken_over_and_its_late_writes_are_refused(
    url: str, reaped: Reaper
) -> None:
    name = f"claims-zombie-{uuid.uuid4().hex[:8]}"
    zombie = reaped.add(Child(_named(url, name), lease_ttl_s=0.5, steer=True))
    ready = zombie.ready
    _stop_between_writes(zombie, url, name)
    control = SubagentControl.open(url, lease_ttl_s=10.0)
    try:
        control.providers.register(FakeProvider())
        parent = control.agents.register("restart-parent")

        def takeover() -> str | None:
            try:
                return control.send_message(
                    parent, ready["running_child"], [TextBlock(text="taken over")]
                ).task_id
            except SubagentControlError as exc:
                # Only a refusal that delivered nothing may be tried again; anything else
                # (DURABILITY_FAILED: it may be in the transcript) would duplicate it.
                if exc.code in (ErrorCode.NOT_DELIVERED, ErrorCode.OWNERSHIP_CONFLICT):
                    attempts.append(f"{exc.code}: {exc}")
                    return None
                raise

        attempts: list[str] = []
        task_id: list[str] = []
        eventually(lambda: bool(task_id.append(t) or True) if (t := takeover()) else False,
                   "the stopped owner's lease lapsed and the child was taken over")  # fmt: skip
        done = control.tasks.wait(task_id[0], timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED
        old = control.tasks.get(ready["running_task"], requester=parent)
        assert old.status is TaskStatus.INTERRUPTED

        zombie.proc.send_signal(signal.SIGCONT)
        seen = len(zombie.lines())
        eventually(
            lambda: any(line.startswith("refused ") for line in zombie.lines()[seen:]),
            "the woken owner's next write was refused",
        )
        zombie.reap()
        lines = zombie.lines()
        acked = [line.split()[1:] for line in lines if line.startswith("ok ")]
        steered_acks = [text for text, route in acked if route == "steered"]
        started_acks = [text for text, route in acked if route == "started"]
        refused = [line.split()[2] for line in lines if line.startswith("refused ")]
        assert control.store is not None
        events = control.store.load(ready["running_child"]).events
        turns = _turns(events)
        # Its own turn, interrupted; the takeover's; then any the woken owner started itself
        # once the takeover's turn was over and it renewed again: a live runtime by then,
        # whose last turn may still be open (reaping it was a SIGKILL; a sweep would
        # recover that turn, and none runs here).
        statuses = [
            t[-1].data["status"] if t[-1].kind == EventKind.TURN_END else "open"
            for t in turns.values()
        ]
        assert statuses[:2] == ["interrupted", "completed"], (statuses, attempts)
        assert "open" not in statuses[:-1], (statuses, attempts)
        prompts = [
            e.data["text"] for e in events if e.kind == EventKind.USER_MESSAGE and e.turn > 2
        ]
        assert prompts == started_acks, (statuses, attempts)
        steered = [e for e in events if e.kind == EventKind.STEERING_MESSAGE]
        # Everything it was told was delivered is in the transcript once, in its order;
        # nothing it was refused; and nothing it wrote itself in the takeover's turn (a
        # message of it forwarded there is written by the takeover's runtime).
        assert [e.data["text"] for e in steered] == steered_acks
        assert not any(e.turn == 2 and "forwarded" not in e.data for e in steered)
        assert not any(e.data.get("text") in refused for e in events if isinstance(e.data, dict))
    finally:
        control.close()


def test_a_killed_owner_is_resumed_at_once_by_a_live_runtime(url: str, reaped: Reaper) -> None:
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    try:
        control.providers.register(FakeProvider())
        parent = control.agents.register("restart-parent")
        owner = reaped.add(Child(url, lease_ttl_s=30.0))
        ready = owner.ready
        owner.proc.send_signal(signal.SIGKILL)
        owner.proc.wait(10)
        # Same host: its pid is gone, so it is dead now, not after its 30 s lease.
        sent = control.send_message(parent, ready["running_child"], [TextBlock(text="go on")])
        assert sent.route == "started"
        assert control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent).status is (
            TaskStatus.COMPLETED
        )
        assert control.tasks.get(ready["running_task"], requester=parent).status is (
            TaskStatus.INTERRUPTED
        )
    finally:
        control.close()
