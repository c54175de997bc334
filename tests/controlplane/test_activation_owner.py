"""One owner per activation (issue 25): the supervisor decides and never acts for the run.

A steer is put into the activation's inbox and delivered by its senders' threads, so a
provider whose ``steer`` blocks, or a steering record whose write is stuck in the store,
holds up only the senders into that one turn: never a supervisor's mailbox (each of these
tests stalled the supervisor before). A send's answer is one `Reply`; a supervisor that
retired with a send queued is observed to have left it unhandled, and the send goes on to
the child's next supervisor.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from actors import ChildSupervisor
from actors.messages import Describe, PassivateIfIdle
from actors.supervisor import mailbox_depth
from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    MessageSource,
    SendResult,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    WAIT_S,
    events,
    eventually,
    held_messages,
    idle_child,
    in_thread,
    raises,
    running_child,
    settle,
    starting_child,
    text,
    wait_published,
)


class _StuckSteeringStore(SqlStore):
    """A real store whose append of a steering record saying ``stuck`` waits on a gate."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def append(self, child_id: str, events: Any, **options: Any) -> Any:
        if any(_says(event, "stuck") for event in events):
            self.entered.set()
            assert self.gate.wait(WAIT_S), "the test never opened the store's gate"
        return super().append(child_id, events, **options)


def _says(event: Any, needle: str) -> bool:
    kind = getattr(event, "kind", None)
    data = getattr(event, "data", None)
    return (
        kind == EventKind.STEERING_MESSAGE
        and isinstance(data, dict)
        and (data.get("text") == needle)
    )


@pytest.fixture
def stuck_store(sqlite_url: str) -> Iterator[_StuckSteeringStore]:
    store = _StuckSteeringStore(sqlite_url)
    yield store
    store.gate.set()


@pytest.fixture
def stuck_control(
    stuck_store: _StuckSteeringStore, provider: FakeProvider
) -> Iterator[SubagentControl]:
    control = SubagentControl(stuck_store)
    control.providers.register(provider)
    yield control
    stuck_store.gate.set()
    control.close(timeout_s=10.0)


def _node_state(control: SubagentControl, child_id: str) -> str:
    (node,) = [n for n in control.dump_tree(timeout_s=1.0).supervisors if n.child_id == child_id]
    return node.state


def test_a_steer_whose_record_write_is_stuck_stalls_no_supervisor(
    stuck_control: SubagentControl,
    stuck_store: _StuckSteeringStore,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    control = stuck_control
    parent = control.agents.register("parent-1", model=PARENT_MODEL)
    stuck_child, stuck_task, _ = running_child(control, parent, provider, hold)
    other_child, other_task, _ = running_child(control, parent, provider, hold)

    stuck = in_thread(lambda: control.send_message(parent, stuck_child, text("stuck")))
    assert stuck_store.entered.wait(WAIT_S)
    # Behind the stuck write: its supervisor decides at once, the message waits its turn.
    behind = in_thread(lambda: control.send_message(parent, stuck_child, text("behind")))
    eventually(lambda: held_messages(control, stuck_child) == 1, "the second message is queued")

    # Its supervisor, and every other, still answers at once.
    assert _node_state(control, stuck_child) == "running"
    steered = control.send_message(parent, other_child, text("elsewhere"))
    assert steered == SendResult(route="steered", task_id=other_task)
    assert not stuck.done()
    assert not behind.done()

    stuck_store.gate.set()
    assert stuck.result(WAIT_S) == SendResult(route="steered", task_id=stuck_task)
    assert behind.result(WAIT_S) == SendResult(route="steered", task_id=stuck_task)
    hold.set()
    settle(control, stuck_task, parent)
    steering = [
        e.data["text"] for e in events(control, stuck_child) if e.kind == "steering/message"
    ]
    assert steering == ["stuck", "behind"]
    assert provider.steered_texts(stuck_child) == ["stuck", "behind"]


def _block_steers(plan: Any) -> tuple[threading.Event, threading.Event]:
    """Make the published run's ``steer`` block until the second event is set; the first is
    set once a steer entered it."""
    run = plan.run
    assert run is not None
    entered, unblock = threading.Event(), threading.Event()
    take = run.steer
    assert take is not None

    def blocking_steer(message: Sequence[TextBlock], source: MessageSource) -> None:
        entered.set()
        assert unblock.wait(WAIT_S), "the test never unblocked the provider's steer"
        take(message, source)

    run.steer = blocking_steer
    return entered, unblock


def _two_sends_behind(
    control: SubagentControl, parent: AgentHandle, child_id: str, entered: threading.Event
) -> tuple[Future[Any], Future[Any]]:
    """Send "first" until it is in the (blocked) provider's steer, then "second", until it
    is queued behind it; both run on threads of their own."""
    first = in_thread(lambda: control.send_message(parent, child_id, text("first")))
    assert entered.wait(WAIT_S)
    second = in_thread(lambda: control.send_message(parent, child_id, text("second")))
    eventually(lambda: held_messages(control, child_id) == 1, "the second is queued")
    return first, second


def test_a_provider_whose_steer_blocks_does_not_stall_the_supervisor(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    child_id, task_id, plan = running_child(control, parent, provider, hold)
    entered, unblock = _block_steers(plan)
    try:
        first, second = _two_sends_behind(control, parent, child_id, entered)

        # The supervisor answers while the provider's steer blocks (it used to run it).
        assert _node_state(control, child_id) == "running"
        (node,) = control.dump_tree(timeout_s=1.0).supervisors
        assert node.mailbox_depth == 0
    finally:
        unblock.set()
    assert first.result(WAIT_S).route == "steered"
    assert second.result(WAIT_S).route == "steered"
    hold.set()
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    assert provider.steered_texts(child_id) == ["first", "second"]


def test_a_send_queued_behind_a_retirement_goes_to_the_next_supervisor_once(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child_id = idle_child(control, parent)
    route = control._routes.get(child_id)
    assert route is not None
    ref = route.supervisor.ref
    gate = threading.Event()
    describe = ChildSupervisor._describe

    def slow_describe(self: ChildSupervisor) -> Any:
        assert gate.wait(WAIT_S)
        return describe(self)

    monkeypatch.setattr(ChildSupervisor, "_describe", slow_describe)
    looking = ref.ask(Describe(), block=False)  # keeps the mailbox busy until the gate opens
    ref.tell(PassivateIfIdle(idle_for_s=0.0))  # then it retires...
    sending = in_thread(lambda: control.send_message(parent, child_id, text("again")))
    eventually(lambda: mailbox_depth(ref) == 2, "the send is queued behind the retirement")
    gate.set()
    looking.get(timeout=WAIT_S)

    # ...and the send behind it, never handled there, starts the child's next turn.
    result = sending.result(WAIT_S)
    assert result.route == "started"
    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
    assert len(provider.resumes) == 1
    assert [e.data["text"] for e in events(control, child_id) if e.kind == "user/message"] == [
        "go",
        "again",
    ]


@pytest.mark.parametrize("round_", range(8))
def test_concurrent_steers_reach_the_model_in_transcript_order_exactly_once(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
    round_: int,
) -> None:
    child_id, task_id, _plan = running_child(control, parent, provider, hold)
    senders, each = 4, 6
    barrier = threading.Barrier(senders)
    rng = random.Random(round_)

    def sender(n: int) -> list[SendResult]:
        barrier.wait(WAIT_S)
        results = []
        for i in range(each):
            if rng.random() < 0.5:
                threading.Event().wait(0)  # yield, to vary the interleaving
            results.append(control.send_message(parent, child_id, text(f"{n}.{i}")))
        return results

    futures: list[Future[list[SendResult]]] = [
        in_thread(functools.partial(sender, n)) for n in range(senders)
    ]
    for future in futures:
        assert all(r.route == "steered" for r in future.result(WAIT_S))
    hold.set()
    settle(control, task_id, parent)

    seen = provider.steered_texts(child_id)
    recorded = [e.data["text"] for e in events(control, child_id) if e.kind == "steering/message"]
    assert recorded == seen
    assert sorted(seen) == sorted(f"{n}.{i}" for n in range(senders) for i in range(each))
    for n in range(senders):  # each sender's own messages keep their order
        assert [t for t in seen if t.startswith(f"{n}.")] == [f"{n}.{i}" for i in range(each)]


def test_a_kill_refuses_the_messages_queued_behind_a_blocked_steer_at_once(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    child_id, task_id, plan = running_child(control, parent, provider, hold)
    entered, unblock = _block_steers(plan)
    try:
        first, second = _two_sends_behind(control, parent, child_id, entered)

        control.tasks.kill(task_id, requester=parent)

        # Told while the provider's steer still blocks the first: nothing waits on it.
        with raises(ErrorCode.NOT_DELIVERED, match="killed"):
            second.result(WAIT_S)
        assert not first.done()
    finally:
        unblock.set()
    # The first was in the provider's hands: taken (steered) or refused by the killed
    # turn (not delivered), and the transcript agrees either way.
    error = first.exception(WAIT_S)
    if error is None:
        delivered = ["first"]
    else:
        assert isinstance(error, SubagentControlError)
        assert error.code is ErrorCode.NOT_DELIVERED
        delivered = []
    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    assert provider.steered_texts(child_id) == delivered
    recorded = [e.data["text"] for e in events(control, child_id) if e.kind == "steering/message"]
    assert recorded == delivered


def test_the_supervisor_publishes_one_view_of_its_activation(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
) -> None:
    gate = threading.Event()
    started, _plan = starting_child(control, parent, provider, gate, result_gate=hold)
    route = control._routes.get(started.child_id)
    assert route is not None
    view = route.supervisor.activation
    assert view is not None
    assert (view.task_id, view.owner_session, view.fence) == (started.task_id, "parent-1", 1)
    assert (view.kind, view.state, view.status) == ("initial", "starting", TaskStatus.RUNNING)

    gate.set()
    wait_published(control, started.child_id)
    running = route.supervisor.activation
    assert running is not None
    assert running.state == "running"
    assert view.state == "starting"  # a snapshot: the one read before never changes

    hold.set()
    settle(control, started.task_id, parent)
    assert route.supervisor.activation is None  # the record is gone with the activation
