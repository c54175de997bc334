"""SPEC §9 forwarding: the holder's answer to a steered forwarded message is written in the
same transaction as the message's steering record, so the two commit together or not at
all, and the holder spends no transaction of its own on the answer.

PostgreSQL only (SQLite has no inbox: it refuses the answer). The store-level tests drive
`SqlStore.append` directly; the others run the sender (runtime B) here and the holder
(runtime A) in this process or in another OS process (``restart_child.py``), reaped pass or
fail.
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import pytest

from controlplane import (
    ChildMeta,
    ErrorCode,
    EventKind,
    NewEvent,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from persistence import InboxItem, RetryPolicy, SqlStore
from persistence._schema import INBOX
from tests.fakes import FakeProvider
from tests.reliability.processes import Reaper, reaping
from tests.reliability.test_restarts import Child
from tests.support import WAIT_S, eventually, in_thread, running_child

pytestmark = pytest.mark.slow

T = TypeVar("T")

SENDER = "sender.Example-Ünï:42"  # dots, capitals, non-ASCII: the channel is a hash of it
HOLDER = "holder-runtime"


@pytest.fixture
def url(pg_url: str) -> str:
    return pg_url


@pytest.fixture
def store(url: str) -> Iterator[SqlStore]:
    with SqlStore(url, retry=RetryPolicy.immediate()) as opened:
        yield opened


def _child(store: SqlStore) -> str:
    child_id = str(uuid.uuid4())
    store.create_child(ChildMeta(child_id=child_id, parent_session="p", depth=1))
    return child_id


def _taken(store: SqlStore, child_id: str) -> str:
    """A message from `SENDER`, taken by `HOLDER` as a notification carried it."""
    assert store.inbox is not None
    item = InboxItem(uuid.uuid4().hex, "send", child_id, SENDER, "p", [], {})
    assert store.inbox.take(item.inbox_id, HOLDER, item) == item
    return item.inbox_id


def _record(inbox_id: str, text: str = "steer") -> NewEvent:
    data = {"text": text, "forwarded": inbox_id}
    return NewEvent(kind=EventKind.STEERING_MESSAGE, turn=1, data=data)


def _forwarded(events: list[SessionEvent], inbox_id: str) -> list[SessionEvent]:
    return [e for e in events if isinstance(e.data, dict) and e.data.get("forwarded") == inbox_id]


def _carrying(events: list[SessionEvent], text: str) -> list[SessionEvent]:
    return [e for e in events if isinstance(e.data, dict) and e.data.get("text") == text]


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# -- the store -------------------------------------------------------------------------


@contextmanager
def _sender_hears(store: SqlStore) -> Iterator[queue.Queue[tuple[str, dict[str, Any] | None]]]:
    """The answers SENDER's listener hears (inbox id, answer) while the block runs."""
    assert store.inbox is not None
    heard: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
    listener = store.inbox.listen(
        SENDER, on_message=lambda *_: None, on_reply=lambda i, a: heard.put((i, a))
    )
    try:
        assert listener.wait_ready(WAIT_S)
        yield heard
    finally:
        listener.close()


def test_a_steering_records_append_answers_its_message_and_notifies_the_sender_at_commit(
    store: SqlStore,
) -> None:
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    with _sender_hears(store) as heard:
        store.append(child_id, [_record(inbox_id)], answer_steered=[(inbox_id, "task-1")])
        # On the sender's own channel (`channel_of`, computed in SQL from the row).
        answer = {"route": "steered", "task_id": "task-1"}
        assert heard.get(timeout=WAIT_S) == (inbox_id, answer)
    assert store.inbox.state_of(inbox_id) == ("answered", answer)
    assert len(_forwarded(store.load(child_id).events, inbox_id)) == 1


def test_an_append_of_several_steering_records_answers_each_of_their_messages(
    store: SqlStore,
) -> None:
    # Several steers queued before one write of the turn go as one batch.
    assert store.inbox is not None
    child_id = _child(store)
    inbox_ids = [_taken(store, child_id) for _ in range(3)]
    with _sender_hears(store) as heard:
        store.append(
            child_id,
            [_record(inbox_id) for inbox_id in inbox_ids],
            answer_steered=[(inbox_id, f"task-{inbox_id}") for inbox_id in inbox_ids],
        )
        answers = {inbox_id: {"route": "steered", "task_id": f"task-{inbox_id}"}
                   for inbox_id in inbox_ids}  # fmt: skip
        assert dict(heard.get(timeout=WAIT_S) for _ in inbox_ids) == answers
    events = store.load(child_id).events
    for inbox_id in inbox_ids:
        assert store.inbox.state_of(inbox_id) == ("answered", answers[inbox_id])
        assert len(_forwarded(events, inbox_id)) == 1


def test_an_append_refused_writes_neither_the_steering_record_nor_the_answer(
    store: SqlStore,
) -> None:
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    with pytest.raises(SubagentControlError) as refused:  # this runtime lost the claim
        store.append(
            child_id, [_record(inbox_id)], fence=(HOLDER, 7), answer_steered=[(inbox_id, "t")]
        )
    assert refused.value.code is ErrorCode.FENCED
    assert store.inbox.state_of(inbox_id) == ("taken", None)
    assert _forwarded(store.load(child_id).events, inbox_id) == []


def test_an_append_whose_commit_went_unheard_is_retried_and_answers_once(
    store: SqlStore,
) -> None:
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    lost = [psycopg.errors.SerializationFailure("could not serialize access (test)")]

    def lose_the_first_acknowledgement() -> None:
        if lost:
            raise lost.pop()

    store._after_commit = lose_the_first_acknowledgement  # the documented test seam
    try:
        store.append(child_id, [_record(inbox_id)], answer_steered=[(inbox_id, "task-1")])
    finally:
        store._after_commit = None
    assert lost == []  # the retry found its committed rows, and wrote nothing again
    assert len(_forwarded(store.load(child_id).events, inbox_id)) == 1
    assert store.inbox.state_of(inbox_id) == ("answered", {"route": "steered", "task_id": "task-1"})


def test_a_refusal_never_replaces_the_steered_answer_committed_with_the_record(
    store: SqlStore,
) -> None:
    # The holder's record committed and answered `steered`, but the acknowledgement was
    # lost past its retries (a server restart): the steer raised DURABILITY_FAILED, which
    # the holder then sends as its answer. The record is the truth, and stays the answer.
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    store.append(child_id, [_record(inbox_id)], answer_steered=[(inbox_id, "task-1")])
    refusal = {"code": "DURABILITY_FAILED", "message": "could not record it", "task_id": None}
    assert not store.inbox.answer(inbox_id, refusal)
    assert store.inbox.state_of(inbox_id) == ("answered", {"route": "steered", "task_id": "task-1"})
    # A refusal whose own commit went unheard is answered again by the retry, unchanged.
    other = _taken(store, child_id)
    assert store.inbox.answer(other, refusal)
    assert store.inbox.answer(other, refusal)
    assert store.inbox.state_of(other) == ("answered", refusal)


def test_a_steering_record_is_written_even_if_its_sender_gave_the_message_up(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The sender abandons a taken message only once it saw the holder dead; it then decides
    # from the transcript, once the holder can no longer write (SPEC §9).
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    assert store.inbox.abandon(inbox_id, state="taken")
    caplog.set_level(logging.WARNING, logger="persistence._inbox")
    store.append(child_id, [_record(inbox_id)], answer_steered=[(inbox_id, "task-1")])
    assert store.inbox.state_of(inbox_id) == ("abandoned", None)
    assert len(_forwarded(store.load(child_id).events, inbox_id)) == 1
    assert f"forwarded message {inbox_id}: answered after its sender left" in caplog.text


_NOT_DELIVERED = {
    "code": "NOT_DELIVERED", "message": "could not deliver it; not delivered", "task_id": None
}  # fmt: skip


@pytest.mark.parametrize("records", [1, 3], ids=["one-record", "a-batch"])
def test_a_steering_record_is_not_written_once_its_message_was_answered_not_delivered(
    store: SqlStore, records: int
) -> None:
    # Issue 36 break 5: a holder that took a message but cannot deliver it answers it
    # NOT_DELIVERED. Its steering record's write may still be on its way (abandoned at
    # fencing, its bytes held by the network): landing after that answer, it must write
    # nothing, or the message would be in the transcript and its sender told otherwise.
    # Before, the record was written whatever the row's state.
    assert store.inbox is not None
    child_id = _child(store)
    inbox_ids = [_taken(store, child_id) for _ in range(records)]
    assert store.inbox.answer(inbox_ids[-1], _NOT_DELIVERED)
    with pytest.raises(SubagentControlError) as refused:
        store.append(
            child_id,
            [_record(inbox_id, f"steer {n}") for n, inbox_id in enumerate(inbox_ids)],
            answer_steered=[(inbox_id, "task-1") for inbox_id in inbox_ids],
        )
    assert refused.value.code is ErrorCode.NOT_DELIVERED
    assert inbox_ids[-1] in refused.value.message
    assert store.load(child_id).events == []  # the whole batch: nothing half-written
    assert store.inbox.state_of(inbox_ids[-1]) == ("answered", _NOT_DELIVERED)
    for inbox_id in inbox_ids[:-1]:
        assert store.inbox.state_of(inbox_id) == ("taken", None)  # still to be answered


def test_a_steering_record_is_not_written_once_its_sender_forgot_its_answered_message(
    store: SqlStore,
) -> None:
    # The sender heard NOT_DELIVERED and deleted the answered row: a late record finds none.
    assert store.inbox is not None
    child_id = _child(store)
    inbox_id = _taken(store, child_id)
    assert store.inbox.answer(inbox_id, _NOT_DELIVERED)
    store.inbox.forget([inbox_id])
    with pytest.raises(SubagentControlError) as refused:
        store.append(child_id, [_record(inbox_id)], answer_steered=[(inbox_id, "task-1")])
    assert refused.value.code is ErrorCode.NOT_DELIVERED
    assert store.load(child_id).events == []


def test_sqlite_has_no_inbox_and_refuses_to_answer_with_an_append(sqlite_url: str) -> None:
    with SqlStore(sqlite_url) as sqlite:
        child_id = _child(sqlite)
        with pytest.raises(SubagentControlError) as refused:
            sqlite.append(child_id, [_record("m")], answer_steered=[("m", "task-1")])
        assert refused.value.code is ErrorCode.INVALID_INPUT
        assert "no inbox" in refused.value.message
        assert sqlite.load(child_id).events == []


# -- two runtimes ----------------------------------------------------------------------


@pytest.fixture
def control(url: str) -> Iterator[SubagentControl]:
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    control.providers.register(FakeProvider())
    yield control
    control.close()


@pytest.fixture
def holder(url: str) -> Iterator[tuple[SubagentControl, FakeProvider]]:
    """Runtime A in this process, on the same store as `control` (runtime B)."""
    provider = FakeProvider()
    control = SubagentControl.open(url, lease_ttl_s=30.0)
    control.providers.register(provider)
    yield control, provider
    control.close()


def test_the_holder_answers_a_steer_with_its_record_and_only_refusals_and_kills_on_their_own(
    control: SubagentControl,
    holder: tuple[SubagentControl, FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, provider = holder
    turn_ends = threading.Event()
    child, task_id, _plan = running_child(a, a.agents.register("p"), provider, turn_ends)
    assert a._forwarder is not None
    inbox = a._forwarder._inbox
    answered_alone: list[dict[str, Any]] = []
    answer = inbox.answer

    def spy(inbox_id: str, reply: dict[str, Any]) -> bool:
        answered_alone.append(reply)
        return answer(inbox_id, reply)

    monkeypatch.setattr(inbox, "answer", spy)
    parent = control.agents.register("p")
    for number in range(3):
        sent = control.send_message(parent, child, [TextBlock(text=f"steer {number}")])
        assert (sent.route, sent.task_id) == ("steered", task_id)
    assert answered_alone == []  # each was answered by its record's transaction
    assert control.store is not None
    events = control.store.load(child).events
    for number in range(3):
        (record,) = _carrying(events, f"steer {number}")
        assert control.store.inbox is not None
        state = control.store.inbox.state_of(record.data["forwarded"])
        assert state == ("answered", {"route": "steered", "task_id": task_id})

    control.tasks.kill(task_id, requester=parent)  # a kill is answered on its own, as before
    assert answered_alone == [{"route": "killed", "task_id": task_id}]
    done = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.KILLED


def test_a_message_notified_twice_is_delivered_once_even_when_the_second_take_is_retried(
    control: SubagentControl,
    holder: tuple[SubagentControl, FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A sender's post retried after a commit whose acknowledgement was lost notifies the
    # holder twice. The second take finds the row taken; had its first attempt failed
    # transiently, its retry (which must accept a row its own first attempt may have
    # taken) would take it again, and the run would get the message twice.
    a, provider = holder
    child, _task_id, plan = running_child(a, a.agents.register("p"), provider, threading.Event())
    assert plan.run is not None
    assert plan.run.steer is not None
    steer, first_entered, first_may_go = plan.run.steer, threading.Event(), threading.Event()

    def held_first(message: Any, source: Any) -> None:
        if not first_entered.is_set():
            first_entered.set()
            first_may_go.wait(WAIT_S)
        steer(message, source)

    plan.run.steer = held_first
    assert a._forwarder is not None
    serving, store = a._forwarder._serving, a.store
    assert store is not None
    message = [{"type": "text", "text": "twice notified"}]
    sender = control.runtime_id
    item = InboxItem(uuid.uuid4().hex, "send", child, sender, "p", message, {"kind": "coordinator"})
    first = in_thread(lambda: serving._take(item.inbox_id, item))
    assert first_entered.wait(WAIT_S)  # taken, and being delivered
    run = store._run
    failed_once: list[str] = []

    def first_take_attempt_fails(action: str, operation: Callable[[int], T]) -> T:
        if not action.startswith("take forwarded message") or failed_once:
            return run(action, operation)

        def attempt(number: int) -> T:
            if number == 1:
                failed_once.append(action)
                raise psycopg.errors.SerializationFailure("could not serialize access (test)")
            return operation(number)

        return run(action, attempt)

    monkeypatch.setattr(store, "_run", first_take_attempt_fails)
    serving._take(item.inbox_id, item)  # the second notification of the same message
    first_may_go.set()
    first.result(timeout=WAIT_S)
    serving.close()  # every delivery handed over by a take is done (the holder takes none)

    assert provider.steered_texts(child) == ["twice notified"]
    assert len(_carrying(store.load(child).events, "twice notified")) == 1


reaped = pytest.fixture(reaping, name="reaped")


def test_a_holder_killed_while_its_steering_record_commits_leaves_neither_record_nor_answer(
    url: str, control: SubagentControl, reaped: Reaper
) -> None:
    owner = reaped.add(Child(url, lease_ttl_s=30.0))
    ready = owner.ready
    parent = control.agents.register("restart-parent")
    child = ready["running_child"]
    assert control.store is not None
    inbox = control.store.inbox
    assert inbox is not None

    # A healthy forward first: steered into A's Task, its record and its answer both in.
    sent = control.send_message(parent, child, [TextBlock(text="first")])
    assert (sent.route, sent.task_id) == ("steered", ready["running_task"])
    (first,) = _carrying(control.store.load(child).events, "first")
    answer = {"route": "steered", "task_id": ready["running_task"]}
    assert inbox.state_of(first.data["forwarded"]) == ("answered", answer)

    # Then every answer waits, inside its transaction, for a lock this test holds: A is
    # killed while its next steering record's transaction waits there.
    key = random.randrange(1, 2**31)
    with (
        psycopg.connect(_libpq(url), autocommit=True) as conn,
        psycopg.connect(_libpq(url), autocommit=True) as lock,
    ):
        conn.execute(
            "CREATE FUNCTION hold_answers() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.state = 'answered' THEN PERFORM pg_advisory_xact_lock({key}); END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER hold_answers BEFORE UPDATE ON {INBOX} "
            "FOR EACH ROW EXECUTE FUNCTION hold_answers()"
        )
        lock.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            sending = in_thread(
                lambda: control.send_message(parent, child, [TextBlock(text="second")])
            )
            waiting: list[int] = []

            def an_answer_waits() -> bool:
                rows = conn.execute(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid = 0 AND objid = %s",
                    (key,),
                ).fetchall()
                waiting[:] = [row[0] for row in rows]
                return bool(waiting)

            eventually(an_answer_waits, "A's answer waits for the lock")
            # The answer waits: the steering record has not committed either.
            assert _carrying(control.store.load(child).events, "second") == []
            owner.proc.send_signal(signal.SIGKILL)
            owner.proc.wait(WAIT_S)
            (pid,) = waiting  # its connection's transaction ends now, uncommitted
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        finally:
            lock.execute("SELECT pg_advisory_unlock(%s)", (key,))
        conn.execute(f"DROP TRIGGER hold_answers ON {INBOX}")

    # A died before delivering it: B hands it back and resumes the child here, once.
    again = sending.result(WAIT_S)
    assert again.route == "started"
    interrupted = control.tasks.get(ready["running_task"], requester=parent)
    assert interrupted.status is TaskStatus.INTERRUPTED
    control.tasks.wait(again.task_id, timeout=WAIT_S, requester=parent)
    (record,) = _carrying(control.store.load(child).events, "second")
    assert record.kind == EventKind.USER_MESSAGE


class _PostUnheard(SqlStore):
    """A sender's store whose post of a forwarded message commits, then fails on every
    attempt, as a server crashing right after the commit would; the failure is reported
    only once the holder has taken the message."""

    def __init__(self, url: str) -> None:
        self._libpq_url = _libpq(url)
        super().__init__(url, retry=RetryPolicy.immediate(max_attempts=2))

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        if not action.startswith("forward a message to runtime") or action.endswith(" again"):
            return super()._run(action, operation)

        def attempt(number: int) -> T:
            if number == 1:
                operation(number)
                eventually(self._taken, "the holder takes the message")
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        return super()._run(action, attempt)

    def _taken(self) -> bool:
        with psycopg.connect(self._libpq_url) as conn:
            row = conn.execute(f"SELECT count(*) FROM {INBOX} WHERE state <> 'pending'").fetchone()
        return row is not None and row[0] > 0


def test_a_forward_whose_post_committed_unheard_is_answered_not_reported_unavailable(
    url: str, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    a, provider = holder
    child, task_id, _plan = running_child(a, a.agents.register("p"), provider, threading.Event())
    with SubagentControl(_PostUnheard(url), lease_ttl_s=30.0) as sender:
        sender.providers.register(FakeProvider())
        parent = sender.agents.register("p")

        sent = sender.send_message(parent, child, [TextBlock(text="posted unheard")])

        # Before, the post's failure was raised (STORE_UNAVAILABLE: not delivered) while
        # the holder had taken the message and steered it.
        assert (sent.route, sent.task_id) == ("steered", task_id)
        assert sender.store is not None
        assert len(_carrying(sender.store.load(child).events, "posted unheard")) == 1


def test_a_forward_taken_but_never_answered_is_answered_within_its_bound_not_at_close(
    url: str, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    # The holder took the message and its delivery hangs (here: the run's steer is held;
    # in the field, a take in the gap between fencing and re-arming). Before, the sender
    # waited without bound while the row was ``taken`` and the holder lived: its send
    # returned only when the holder closed.
    a, provider = holder
    child, _task_id, plan = running_child(a, a.agents.register("p"), provider, threading.Event())
    assert plan.run is not None
    assert plan.run.steer is not None
    steer, entered, may_go = plan.run.steer, threading.Event(), threading.Event()

    def held(message: Any, source: Any) -> None:
        entered.set()
        may_go.wait(WAIT_S * 6)
        steer(message, source)

    plan.run.steer = held
    sender = SubagentControl.open(url, lease_ttl_s=30.0, retry=RetryPolicy(max_total_s=1.0))
    try:
        parent = sender.agents.register("p")
        sent = in_thread(lambda: sender.send_message(parent, child, [TextBlock(text="stuck")]))
        assert entered.wait(WAIT_S)  # taken, and its delivery hangs
        try:
            with pytest.raises(SubagentControlError) as unanswered:
                sent.result(timeout=WAIT_S * 3)
        finally:
            may_go.set()
        assert unanswered.value.code is ErrorCode.DURABILITY_FAILED, unanswered.value
        assert "transcript" in unanswered.value.message
    finally:
        sender.close()


def test_a_take_fenced_before_its_delivery_is_answered_not_delivered_and_a_retry_lands_once(
    url: str, holder: tuple[SubagentControl, FakeProvider]
) -> None:
    # Issue 36 break 5, the holder's side: the holder took the message, and its runtime
    # fenced itself (lease lost) before the steer's record could be written: the record
    # never will be, so the message was not delivered, and the holder must say so rather
    # than leave its sender to decide from the transcript. Before, its sender heard
    # DURABILITY_FAILED ("may or may not be in the transcript") for a message the fence
    # had made certain was not.
    a, provider = holder
    owner = a.agents.register("p")
    child, task_id, plan = running_child(a, owner, provider, threading.Event())
    assert plan.run is not None
    assert plan.run.steer is not None
    steer, entered, may_go = plan.run.steer, threading.Event(), threading.Event()

    def held(message: Any, source: Any) -> None:
        entered.set()
        may_go.wait(WAIT_S * 6)
        steer(message, source)

    plan.run.steer = held
    sender = SubagentControl.open(url, lease_ttl_s=30.0)
    sender.providers.register(FakeProvider())  # the retry may start the child here
    try:
        parent = sender.agents.register("p")
        sent = in_thread(lambda: sender.send_message(parent, child, [TextBlock(text="cut")]))
        assert entered.wait(WAIT_S)  # taken, and its delivery is under way
        fenced = "lease lost (test)"
        a._tasks.fence(fenced)  # the watchdog's path: stop acting
        may_go.set()
        with pytest.raises(SubagentControlError) as refused:
            sent.result(timeout=WAIT_S * 3)
        assert refused.value.code is ErrorCode.NOT_DELIVERED, refused.value
        assert a.store is not None
        eventually(lambda: a._tasks.flush() == 0, "the fenced settlement written")
        a._tasks.readmit(fenced)
        assert _carrying(a.store.load(child).events, "cut") == []
        # The caller's retry is delivered, once (the fenced Task let the child go).
        again = sender.send_message(parent, child, [TextBlock(text="cut again")])
        assert again.route in ("steered", "started")
        store = a.store
        eventually(
            lambda: len(_carrying(store.load(child).events, "cut again")) == 1,
            "the retry in the transcript",
        )
        assert a.tasks.get(task_id, requester=owner).status is TaskStatus.INTERRUPTED
    finally:
        may_go.set()
        sender.close()
