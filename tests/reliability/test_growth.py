"""The store does not grow with every process ever run (issue 24, item 8): what a runtime
gone for good leaves — its runtime row, the inbox rows of the messages it forwarded — is
deleted by a live runtime's heartbeat thread, and a forward's liveness check of its target
reads that one runtime's row, whatever the table holds.

Real processes (``claim_child.py``) opened and SIGKILLed; every process a test starts is
reaped, pass or fail.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import event, text

from controlplane import ErrorCode, SubagentControl, SubagentControlError, TextBlock
from controlplane.runtime.lease._runtime import Runtime
from controlplane.runtime.routing._forwarding import TAKE_S
from persistence import SqlStore, boot_id
from tests.fakes import FakeProvider
from tests.reliability.processes import Reaper, Sender, reaping
from tests.reliability.test_forwarding import LONG, Owner, _owner
from tests.support import WAIT_S, eventually, in_thread, running_child

pytestmark = pytest.mark.slow

PARENT = "claim-parent"  # claim_child.py's parent
KILLED = 5
ROUNDS = 2
LEASE_TTL_S = 3.0  # the test's runtime sweeps (and expires) every second

reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture
def control(store_url: str) -> Iterator[SubagentControl]:
    control = SubagentControl.open(store_url, lease_ttl_s=LEASE_TTL_S)
    yield control
    control.close()


@pytest.fixture
def owner(store_url: str, control: SubagentControl, reaped: Reaper) -> Owner:
    """Runtime A in another process, running a child this runtime forwards to."""
    if not store_url.startswith("postgresql"):
        pytest.skip("forwarding is PostgreSQL's; SQLite refuses at once")
    return _owner(store_url, control, reaped)


def _register_others(store: SqlStore) -> None:
    """Rows of 40 runtimes that other processes opened (and are not expired yet)."""
    for i in range(40):
        store.ledger.register_runtime(
            f"other-{i}", host="elsewhere", pid=1, boot_id=None, lease_ttl_s=30.0
        )


def _runtime(control: SubagentControl) -> Runtime:
    runtime = control._runtime
    assert runtime is not None
    return runtime


def _store(control: SubagentControl) -> SqlStore:
    assert control.store is not None
    return control.store


def _inbox_rows(store: SqlStore, by: str = "sender_runtime") -> dict[str, int]:
    """Inbox rows per sender runtime (or per value of the column ``by``)."""
    query = text(f"SELECT {by}, count(*) FROM subagent_inbox GROUP BY {by}")
    with store._db.engine.connect() as conn:
        return {str(value): int(n) for value, n in conn.execute(query)}


def _runtime_ids(store: SqlStore) -> set[str]:
    return {runtime.runtime_id for runtime in store.ledger.runtimes()}


def test_what_sigkilled_and_closed_runtimes_leave_is_expired_and_a_live_senders_rows_stay(
    store_url: str, control: SubagentControl, reaped: Reaper
) -> None:
    if boot_id() is None:
        pytest.skip("no kernel boot id: a SIGKILLed process is gone only after its lease + 1 h")
    postgres = store_url.startswith("postgresql")
    store = _store(control)
    provider = FakeProvider()
    control.providers.register(provider)
    gate = threading.Event()
    child, task, _ = running_child(control, control.agents.register(PARENT), provider, gate)
    try:
        # Each sender forwards to the running child here (PostgreSQL: steered, its inbox
        # rows waiting for a batch to forget them; SQLite: refused, the holder is here).
        senders = [reaped.add(Sender(store_url, child, f"s{i}")) for i in range(KILLED + 1)]
        ids = [sender.expect("ready ") for sender in senders]
        for sender in senders:
            for round_ in range(ROUNDS):
                sender.say(f"go {round_}")
                reply = sender.next_line()
                expected = f"steered {task}" if postgres else "refused OWNERSHIP_CONFLICT"
                assert reply == expected, (reply, sender.stderr())
        *killed, survivor = senders
        survivor_id = ids[-1]
        for sender in killed:
            sender.reap()  # SIGKILL: no close, its rows left as they were
        own = _runtime(control).id
        eventually(
            lambda: _runtime_ids(store) == {own, survivor_id},
            f"only this runtime and the live sender are in the store ({_runtime_ids(store)})",
            timeout=WAIT_S * 3,
        )
        if postgres:
            # The live sender's rows stay: it decides when they go (the sweeps since the
            # kills, which expired the dead senders' rows, did not touch them).
            eventually(
                lambda: _inbox_rows(store) == {survivor_id: ROUNDS},
                f"only the live sender's rows are left ({_inbox_rows(store)})",
                timeout=WAIT_S * 3,
            )
        survivor.say("quit")
        assert survivor.next_line() == "closed"
        eventually(
            lambda: _runtime_ids(store) == {own},
            f"the closed sender's row is expired too ({_runtime_ids(store)})",
            timeout=WAIT_S * 3,
        )
        assert _inbox_rows(store) == {}
    finally:
        gate.set()


def test_a_forwards_liveness_check_of_its_target_reads_that_runtimes_row_only(
    control: SubagentControl,
) -> None:
    store = _store(control)
    _register_others(store)
    statements: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement not in ("BEGIN", "COMMIT"):  # SQLite's transaction, spelled out
            statements.append((statement, parameters))

    event.listen(store._db.engine, "before_cursor_execute", seen)
    try:
        assert _runtime(control).is_dead_id("other-7") is False
        assert _runtime(control).is_dead_id("never-was") is True
    finally:
        event.remove(store._db.engine, "before_cursor_execute", seen)
    # One statement per check, each a read of the runtimes table by its key.
    assert len(statements) == 2, statements
    for (statement, parameters), wanted in zip(statements, ["other-7", "never-was"], strict=True):
        assert "FROM subagent_runtimes" in statement
        assert "WHERE subagent_runtimes.runtime_id =" in statement
        assert wanted in str(parameters)


def test_a_message_taken_back_leaves_no_row_once_its_late_target_heard_of_it(
    control: SubagentControl, owner: Owner
) -> None:
    # Whoever sent it: a sender SIGKILLed after it gave up never forgets the row, and
    # `expire_leftovers` keeps it while the target lives (it refuses the target's late take).
    store = _store(control)
    owner.process.proc.send_signal(signal.SIGSTOP)
    try:
        sends = [
            in_thread(partial(control.send_message, owner.parent, owner.child, [TextBlock(text=t)]))
            for t in ["never taken", "never taken, long: " + "x" * LONG]
        ]
        for send in sends:
            with pytest.raises(SubagentControlError) as refused:
                send.result(TAKE_S + WAIT_S)
            assert refused.value.code is ErrorCode.NOT_DELIVERED
        assert _inbox_rows(store, by="state") == {"abandoned": 2}
    finally:
        owner.process.proc.send_signal(signal.SIGCONT)
    # Awake, the target hears both notifications late, cannot take either, and deletes
    # their rows: this runtime, their live sender, has not forgotten them yet (a batch).
    eventually(
        lambda: _inbox_rows(store, by="state") == {},
        f"the late target deleted the rows that refused it ({_inbox_rows(store, by='state')})",
    )
    events = store.load(owner.child).events
    assert not [e for e in events if isinstance(e.data, dict) and "never taken" in
                str(e.data.get("text"))]  # fmt: skip


def test_a_forwards_polls_read_its_targets_row_only_however_many_runtimes_the_store_knows(
    control: SubagentControl, owner: Owner
) -> None:
    store = _store(control)
    _register_others(store)
    sending = threading.get_ident()
    reads: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        # The sending thread's only: the heartbeat thread reads the table on its own.
        if threading.get_ident() == sending and "subagent_runtimes" in statement:
            reads.append((statement, parameters))

    owner.process.proc.send_signal(signal.SIGSTOP)  # it never takes: the sender polls
    event.listen(store._db.engine, "before_cursor_execute", seen)
    try:
        with pytest.raises(SubagentControlError) as refused:
            control.send_message(owner.parent, owner.child, [TextBlock(text="polled")])
    finally:
        event.remove(store._db.engine, "before_cursor_execute", seen)
        owner.process.proc.send_signal(signal.SIGCONT)
    assert refused.value.code is ErrorCode.NOT_DELIVERED
    assert len(reads) >= 5, reads  # a poll every 0.25 s at most, for TAKE_S
    for statement, parameters in reads:
        assert "WHERE subagent_runtimes.runtime_id =" in statement, statement
        assert owner.runtime_id in str(parameters), parameters
