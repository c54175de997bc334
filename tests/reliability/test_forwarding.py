"""SPEC §9 routing across runtimes: a send from this process (runtime B) to a child whose
activation runs in another process (runtime A) is forwarded to A through PostgreSQL and
answered there, exactly once or not delivered. On SQLite it is refused with
``OWNERSHIP_CONFLICT`` naming A.

Real OS processes (``restart_child.py``, ``claim_child.py``); every process a test starts
is reaped, pass or fail.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    MessageSource,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.runtime.routing._forwarding import TAKE_S
from persistence import RetryPolicy, SqlStore
from tests.fakes import FakeProvider
from tests.reliability.processes import Reaper, Sender, reaping
from tests.reliability.test_restarts import Child
from tests.support import WAIT_S, eventually, idle_child, in_thread, raises, running_child

pytestmark = pytest.mark.slow

ROUNDS = 8
LONG = 9000  # characters: too long for a notification, so the message goes as a row


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture
def control(url: str) -> Iterator[SubagentControl]:
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    control.providers.register(FakeProvider())
    yield control
    control.close()


@pytest.fixture
def holder(url: str) -> Iterator[tuple[SubagentControl, FakeProvider]]:
    """Runtime A in this process, on the same store as `control` (runtime B)."""
    _forwarding_only(url)
    provider = FakeProvider()
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    control.providers.register(provider)
    yield control, provider
    control.close()


def _postgres(url: str) -> bool:
    return url.startswith("postgresql")


def _forwarding_only(url: str) -> None:
    if not _postgres(url):
        pytest.skip("forwarding is PostgreSQL's; SQLite refuses at once")


@dataclass(frozen=True)
class Owner:
    """Runtime A in another process (``restart_child.py``): a child whose first Task is
    done and whose second runs there, under a parent this runtime (B) registered too."""

    process: Child
    parent: AgentHandle
    """The parent, in runtime B."""
    child: str
    task: str
    """The Task running in A."""
    done_task: str
    runtime_id: str

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        self.process.proc.send_signal(signal.SIGKILL)
        self.process.proc.wait(10)


def _owner(url: str, control: SubagentControl, reaped: Reaper) -> Owner:
    """Runtime A (`Owner`), started and ready."""
    process = reaped.add(Child(url, lease_ttl_s=30.0))
    ready = process.ready
    return Owner(
        process,
        control.agents.register("restart-parent"),
        child=ready["running_child"],
        task=ready["running_task"],
        done_task=ready["done_task"],
        runtime_id=ready["runtime_id"],
    )


def _carrying(events: list[SessionEvent], text: str) -> list[SessionEvent]:
    return [e for e in events if isinstance(e.data, dict) and e.data.get("text") == text]


def _opened_by(events: list[SessionEvent]) -> dict[str, int]:
    return {
        e.data["task_id"]: e.turn
        for e in events
        if e.kind == EventKind.TURN_START and isinstance(e.data, dict)
    }


def _once(events: list[SessionEvent], text: str, kind: str, task_id: str) -> SessionEvent:
    """The one event carrying ``text``, which is a ``kind`` in the turn ``task_id`` opened."""
    carrying = _carrying(events, text)
    assert len(carrying) == 1, (text, carrying)
    (record,) = carrying
    assert record.kind == kind, (text, record)
    assert record.turn == _opened_by(events)[task_id], (text, record)
    return record


def test_a_send_from_another_process_steers_its_running_child_exactly_once(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    owner = _owner(url, control, reaped)
    parent, child = owner.parent, owner.child
    assert control.store is not None

    if not _postgres(url):
        with pytest.raises(SubagentControlError) as refused:
            control.send_message(parent, child, [TextBlock(text="from B")])
        assert refused.value.code is ErrorCode.OWNERSHIP_CONFLICT
        assert owner.runtime_id in refused.value.message
        assert _carrying(control.store.load(child).events, "from B") == []
        return

    sent = control.send_message(parent, child, [TextBlock(text="from B")])
    assert (sent.route, sent.task_id) == ("steered", owner.task)
    events = control.store.load(child).events  # durable before `steered` came back
    record = _once(events, "from B", EventKind.STEERING_MESSAGE, owner.task)
    assert record.data["forwarded"]
    assert record.source is not None
    assert record.source.sender_session_id == "restart-parent"
    # A's Task still runs there, and this runtime started nothing.
    tasks = {t.id: t.status for t in control.tasks.list(parent)}
    assert tasks == {owner.done_task: TaskStatus.COMPLETED, owner.task: TaskStatus.RUNNING}


def test_a_forwarded_send_racing_the_end_of_the_turn_is_steered_resumed_or_not_delivered(
    url: str,
    control: SubagentControl,
    reaped: Reaper,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.runtime.routing._forward_answer")
    parent = control.agents.register("claim-parent")
    child = idle_child(control, parent)
    owner = reaped.add(Sender(url, child, "a"))
    assert owner.next_line().startswith("ready ")
    steered: dict[str, str] = {}  # message text -> Task id
    started: dict[str, str] = {}
    refused: dict[str, ErrorCode] = {}
    for number in range(ROUNDS):
        owner.say(f"go {number}")
        answer = owner.next_line()
        if answer.startswith("started "):
            started[f"a-{number}"] = answer.split()[1]
        text = f"b-{number}"  # sent while A's 20 ms turn runs, or just after it ended
        try:
            sent = control.send_message(parent, child, [TextBlock(text=text)])
        except SubagentControlError as exc:
            refused[text] = exc.code
        else:
            (steered if sent.route == "steered" else started)[text] = sent.task_id
            if sent.route == "started":
                done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
                assert done.status is TaskStatus.COMPLETED
        if answer.startswith("started "):
            assert owner.next_line() == "settled completed"
    owner.say("quit")
    assert owner.next_line() == "closed"

    assert control.store is not None
    events = control.store.load(child).events
    for text, task_id in steered.items():
        _once(events, text, EventKind.STEERING_MESSAGE, task_id)
    for text, task_id in started.items():
        _once(events, text, EventKind.USER_MESSAGE, task_id)
    allowed = {ErrorCode.NOT_DELIVERED}
    if not _postgres(url):
        allowed.add(ErrorCode.OWNERSHIP_CONFLICT)  # SQLite does not forward
    for text, code in refused.items():
        assert code in allowed, (text, code)
        assert _carrying(events, text) == []  # not delivered: nowhere
    if _postgres(url):
        # Some sends met A's claim: steered there, refused, or handed back by A once its
        # turn had ended (then resumed here: in `started`, checked above).
        handed_back = [r for r in caplog.records if "no longer runs it" in r.getMessage()]
        assert steered or refused or handed_back


def test_a_message_the_owner_never_takes_is_not_delivered_within_a_bound_and_is_nowhere(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    _forwarding_only(url)
    owner = _owner(url, control, reaped)
    parent, child = owner.parent, owner.child
    assert control.store is not None
    # A short message travels in its notification, a long one as a row: both are taken
    # back when the owner does not take them.
    never = ["never taken", "never taken, long: " + "x" * LONG]
    owner.process.proc.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        sends = [
            in_thread(lambda text=text: control.send_message(parent, child, [TextBlock(text=text)]))
            for text in never
        ]
        refusals = []
        for send in sends:
            with pytest.raises(SubagentControlError) as refused:
                send.result(TAKE_S + WAIT_S)
            refusals.append(refused.value.code)
        took = time.monotonic() - began
    finally:
        owner.process.proc.send_signal(signal.SIGCONT)
    assert refusals == [ErrorCode.NOT_DELIVERED] * 2
    assert took < TAKE_S + WAIT_S / 2
    # Awake again, the owner hears the old notifications but can no longer take the
    # messages; new ones are steered, and only the new ones are in the transcript.
    taken = ["taken", "taken, long: " + "y" * LONG]
    for text in taken:
        sent = control.send_message(parent, child, [TextBlock(text=text)])
        assert (sent.route, sent.task_id) == ("steered", owner.task)
    events = control.store.load(child).events
    for text in never:
        assert _carrying(events, text) == []
    for text in taken:
        _once(events, text, EventKind.STEERING_MESSAGE, owner.task)


def test_a_message_taken_back_and_forgotten_by_its_sender_still_refuses_a_late_take(
    url: str, control: SubagentControl, reaped: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the kernel-fault stress run (a holder cut off by DROP rules): the sender
    # forgot every decided row, the rows it had taken back too, and the holder's late
    # take (its notification or its INSERT held in the partition) found no row, took
    # the message and delivered it: told NOT_DELIVERED, yet in the transcript.
    _forwarding_only(url)
    monkeypatch.setattr("controlplane.runtime.routing._forwarding._FORGET_BATCH", 1)
    assert control._forwarder is not None
    forget, forgotten = control._forwarder._forget, threading.Event()

    def forget_and_say(inbox_ids: list[str]) -> None:
        forget(inbox_ids)
        forgotten.set()

    monkeypatch.setattr(control._forwarder, "_forget", forget_and_say)
    owner = _owner(url, control, reaped)
    parent, child = owner.parent, owner.child
    assert control.store is not None
    owner.process.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(SubagentControlError) as refused:
            control.send_message(parent, child, [TextBlock(text="never taken")])
        assert refused.value.code is ErrorCode.NOT_DELIVERED
        assert forgotten.wait(WAIT_S)  # the sender forgot what it decided
    finally:
        owner.process.proc.send_signal(signal.SIGCONT)
    # Awake, the owner hears the old notification: its take is refused by the row the
    # sender kept, and the owner deletes it. (Had the sender deleted it, the take would
    # write a row of its own and deliver the message.)
    store = control.store
    eventually(lambda: _inbox_states(store) == {}, "the late take was refused, its row deleted")
    sent = control.send_message(parent, child, [TextBlock(text="taken")])
    assert (sent.route, sent.task_id) == ("steered", owner.task)
    events = store.load(child).events
    assert _carrying(events, "never taken") == []


def test_a_kill_from_another_process_kills_the_task_where_it_runs(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    owner = _owner(url, control, reaped)
    parent = owner.parent
    if not _postgres(url):
        with pytest.raises(SubagentControlError) as refused:
            control.tasks.kill(owner.task, requester=parent)
        assert refused.value.code is ErrorCode.OWNERSHIP_CONFLICT
        assert owner.runtime_id in refused.value.message
        return
    control.tasks.kill(owner.task, requester=parent)
    done = control.tasks.wait(owner.task, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.KILLED
    assert done.runtime_id == owner.runtime_id  # settled there, not interrupted here


def _steered_there_then_killed(
    url: str, control: SubagentControl, reaped: Reaper, text: str
) -> Owner:
    """PostgreSQL: ``text`` forwarded from here and steered into A's running Task, then A
    killed (SIGKILL, waited for); skips on SQLite."""
    _forwarding_only(url)
    owner = _owner(url, control, reaped)
    sent = control.send_message(owner.parent, owner.child, [TextBlock(text=text)])
    assert (sent.route, sent.task_id) == ("steered", owner.task)
    owner.kill()
    return owner


def test_a_message_whose_holder_died_after_taking_it_is_decided_by_the_transcript(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    owner = _steered_there_then_killed(url, control, reaped, "kept")
    parent, child = owner.parent, owner.child
    assert control.store is not None
    events = control.store.load(child).events
    record = _once(events, "kept", EventKind.STEERING_MESSAGE, owner.task)
    # What the sender does when the holder took a message and died unanswered: the dead
    # runtime is fenced off first, then the steering record (which names the inbox id) says.
    forwarder = control._forwarder
    assert forwarder is not None
    decided = forwarder._finder.decide_without(record.data["forwarded"], child, owner.runtime_id)
    assert (decided.route, decided.task_id) == ("steered", owner.task)
    # Not in the transcript: not delivered, and handed back to be routed again.
    assert forwarder._finder.decide_without("never-written", child, owner.runtime_id) is None
    running = control.tasks.get(owner.task, requester=parent)
    assert running.status is TaskStatus.INTERRUPTED


def test_a_forwarded_send_is_in_both_runtimes_trees_while_in_flight_and_gone_after(
    control: SubagentControl, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    a, provider = holder
    turn_ends = threading.Event()
    child, task_id, plan = running_child(a, a.agents.register("tree-parent"), provider, turn_ends)
    # A's run holds the forwarded message in its steer until the test lets it through.
    assert plan.run is not None
    assert plan.run.steer is not None
    deliver, entered, let_through = plan.run.steer, threading.Event(), threading.Event()

    def held_steer(message: Sequence[TextBlock], source: MessageSource) -> None:
        entered.set()
        assert let_through.wait(WAIT_S)
        deliver(message, source)

    plan.run.steer = held_steer
    parent = control.agents.register("tree-parent")
    sending = in_thread(lambda: control.send_message(parent, child, [TextBlock(text="held")]))
    try:
        assert entered.wait(WAIT_S)
        sender_tree, holder_tree = control.dump_tree(), a.dump_tree()
    finally:
        let_through.set()
    (sent,) = sender_tree.forwarded
    assert (sent.direction, sent.child_id, sent.runtime_id) == ("sending", child, a.runtime_id)
    (served,) = holder_tree.forwarded
    assert (served.direction, served.child_id, served.runtime_id, served.inbox_id) == (
        "serving", child, control.runtime_id, sent.inbox_id,
    )  # fmt: skip
    assert (
        f"└─ forwarded {sent.inbox_id} [sending] child={child} to runtime {a.runtime_id}"
        in sender_tree.render()
    )
    assert f"[serving] child={child} from runtime {control.runtime_id}" in holder_tree.render()

    assert sending.result(WAIT_S).task_id == task_id
    assert control.dump_tree().forwarded == []
    eventually(lambda: a.dump_tree().forwarded == [], "the holder answered and let it go")
    turn_ends.set()


def test_a_claim_let_go_between_the_refusal_and_the_lookup_is_not_an_ownership_conflict(
    control: SubagentControl,
    holder: tuple[SubagentControl, FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by the cross-process stress test (once, seed 82137): the claim here was refused
    # because A held the child, but when the sender asked who holds it, nobody did (A had
    # let it go). Every such race is routed again; if it keeps happening the message is
    # NOT_DELIVERED, "retry it" — never OWNERSHIP_CONFLICT naming a runtime that no longer
    # holds the child (on PostgreSQL that code means a live agent here uses the child's id).
    a, provider = holder
    turn_ends = threading.Event()
    child, _task_id, _plan = running_child(a, a.agents.register("tree-parent"), provider, turn_ends)
    parent = control.agents.register("tree-parent")
    assert control._forwarder is not None
    lookups: list[str] = []

    def let_go_meanwhile(child_id: str) -> str | None:
        lookups.append(child_id)
        return None

    monkeypatch.setattr(control._forwarder, "holder_of", let_go_meanwhile)

    with pytest.raises(SubagentControlError) as refused:
        control.send_message(parent, child, [TextBlock(text="never delivered")])
    assert refused.value.code is ErrorCode.NOT_DELIVERED, refused.value
    assert "kept moving between runtimes" in refused.value.message
    assert lookups == [child] * 3  # every refusal was looked up and routed again
    turn_ends.set()
    assert control.store is not None
    assert _carrying(control.store.load(child).events, "never delivered") == []


def test_a_runtime_that_no_longer_runs_the_child_hands_the_message_back_to_resume_it_here(
    control: SubagentControl, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    a, provider = holder
    turn_ends = threading.Event()
    child, task_id, _plan = running_child(a, a.agents.register("tree-parent"), provider, turn_ends)
    parent = control.agents.register("tree-parent")
    sent = control.send_message(parent, child, [TextBlock(text="steered there")])
    assert (sent.route, sent.task_id) == ("steered", task_id)
    turn_ends.set()  # A's turn ends and it lets the child go
    assert a.tasks.wait(task_id, timeout=WAIT_S, requester="tree-parent").status.is_terminal
    eventually(lambda: control._forwarder is not None and control._forwarder.holder_of(child)
               is None, "A released its claim")  # fmt: skip

    # B last reached the child in A and tries there first; A answers that it does not run
    # it, and the message resumes it here, exactly once.
    again = control.send_message(parent, child, [TextBlock(text="resumed here")])
    assert again.route == "started"
    done = control.tasks.wait(again.task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED
    assert control.store is not None
    events = control.store.load(child).events
    _once(events, "resumed here", EventKind.USER_MESSAGE, again.task_id)


def test_a_message_to_a_holder_that_died_resumes_the_child_without_waiting_out_the_take_bound(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    # One forward there: this runtime now sends the child's messages straight to A.
    owner = _steered_there_then_killed(url, control, reaped, "first")
    parent, child = owner.parent, owner.child

    began = time.monotonic()
    sent = control.send_message(parent, child, [TextBlock(text="after the kill")])
    took = time.monotonic() - began
    assert sent.route == "started"  # taken back from dead A, then resumed here
    assert took < TAKE_S
    assert control.tasks.get(owner.task, requester=parent).status is TaskStatus.INTERRUPTED
    control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert control.store is not None
    events = control.store.load(child).events
    _once(events, "after the kill", EventKind.USER_MESSAGE, sent.task_id)


def test_a_holder_the_sweep_spares_is_never_decided_without_being_fenced(
    url: str, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    # The sender judged the holder dead, but its sweep judged again and spared it (this
    # runtime's own renewals broke meanwhile, SPEC §9 Outages): the holder still holds the
    # child and may yet commit the record. Reading the transcript now and answering "not
    # delivered" let a later record make a refused message delivered (seen once in the
    # restart stress run as "refused but stored"). Before: None (routed again).
    a, provider = holder
    gate = threading.Event()
    parent = a.agents.register("spared-parent")
    child, task_id, _plan = running_child(a, parent, provider, gate)
    sender = SubagentControl.open(url, lease_ttl_s=30.0, retry=RetryPolicy(max_total_s=0.5))
    try:
        forwarder = sender._forwarder
        assert forwarder is not None
        with raises(ErrorCode.DURABILITY_FAILED, match="may be in the child's transcript"):
            forwarder._finder.decide_without("unanswered", child, a.runtime_id)
        assert a.tasks.get(task_id, requester=parent).status is TaskStatus.RUNNING
    finally:
        gate.set()
        sender.close()


def _inbox_states(store: SqlStore) -> dict[str, int]:
    """How many inbox rows are in each state."""
    query = sa.text("SELECT state, count(*) FROM subagent_inbox GROUP BY state")
    with store._db.engine.connect() as conn:
        return {str(state): int(n) for state, n in conn.execute(query)}
