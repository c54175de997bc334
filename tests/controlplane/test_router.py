"""The router's decision table (`controlplane.runtime.routing._router`), one route per test, on real
stores: SQLite in ``tmp_path`` and PostgreSQL (its forwarding) when its URL is set.

Each runtime is a real `Runtime` on its own `SqlStore` (as another process would open it),
with a real `Forwarder` on PostgreSQL; only this runtime's own side — the actors the router
hands a send to (`deliver_here`) and the Task service a forwarded kill reaches
(`kill_here`) — is a fake, `Here`, that claims the child as a resume does, or steers by
writing the steering record that answers a forwarded message, as a running activation does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from actors import SendMessage
from controlplane import (
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import (
    AgentRegistry,
    CancelSignal,
    ChildMeta,
    ClaimConflict,
    NewEvent,
    SendResult,
    TaskSnapshot,
    utcnow,
)
from controlplane.runtime.lease._runtime import Runtime, new_runtime_id
from controlplane.runtime.routing._forwarding import Forwarder
from controlplane.runtime.routing._router import _CLAIM_RACES, Router
from controlplane.runtime.tasks._tasks import TaskService
from persistence import InboxItem, SqlStore
from tests.support import raises

PARENT = "router-parent"
_WIRING = ("on_claim", "on_foreign_kill", "on_interrupt", "forward_kill")
"""The setters the control plane was once wired with, after construction."""


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def _postgres(url: str) -> bool:
    return url.startswith("postgresql")


@dataclass
class Here:
    """This runtime's own side, faked (`controlplane.runtime.routing._router.DeliverHere` and
    ``kill_here``): records what reached it, and answers with ``answer``."""

    answer: Callable[[str, SendMessage], SendResult]
    sends: list[tuple[str, SendMessage]] = field(default_factory=list)
    kills: list[tuple[str, str]] = field(default_factory=list)

    def deliver(self, child_id: str, send: SendMessage) -> SendResult:
        self.sends.append((child_id, send))
        return self.answer(child_id, send)

    def kill(self, task_id: str, reason: str) -> bool:
        self.kills.append((task_id, reason))
        return True


@dataclass
class Side:
    """One runtime: its store, presence, router and own side."""

    store: SqlStore
    runtime: Runtime
    router: Router
    here: Here


class Runtimes:
    """Opens runtimes on one store URL, each as another process would, and closes them."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._opened: list[Side] = []

    def open(self, answer: Callable[[Side], Callable[[str, SendMessage], SendResult]]) -> Side:
        store = SqlStore(self._url)
        runtime = Runtime(new_runtime_id(), store, lease_ttl_s=30.0)
        forwarder = Forwarder(runtime, store) if store.inbox is not None else None
        here = Here(answer=_unset)
        router = Router(
            runtime, forwarder, AgentRegistry(), deliver_here=here.deliver, kill_here=here.kill
        )
        side = Side(store, runtime, router, here)
        here.answer = answer(side)
        router.start()
        self._opened.append(side)
        return side

    def close(self) -> None:
        for side in self._opened:
            side.router.close()
            side.store.close()


def _unset(child_id: str, send: SendMessage) -> SendResult:
    raise AssertionError("no answer set")


@pytest.fixture
def runtimes(url: str) -> Iterator[Runtimes]:
    opened = Runtimes(url)
    yield opened
    opened.close()


def _task(child_id: str, runtime: Runtime) -> TaskSnapshot:
    return TaskSnapshot(
        id=str(uuid.uuid4()),
        label="follow-up",
        owner_session=PARENT,
        status=TaskStatus.RUNNING,
        child_id=child_id,
        runtime_id=runtime.id,
        created_at=utcnow(),
    )


def resumes(side: Side) -> Callable[[str, SendMessage], SendResult]:
    """As the supervisor resumes an idle child: its Task admitted with the claim on the
    child (the router's `claim`: ``ClaimConflict`` when another live runtime holds it)."""

    def answer(child_id: str, send: SendMessage) -> SendResult:
        task = _task(child_id, side.runtime)
        side.router.claim(task)
        return SendResult(route="started", task_id=task.id)

    return answer


def steers(task: TaskSnapshot) -> Callable[[Side], Callable[[str, SendMessage], SendResult]]:
    """As a running activation steers: the steering record, which answers a forwarded
    message in its own transaction."""

    def bind(side: Side) -> Callable[[str, SendMessage], SendResult]:
        def answer(child_id: str, send: SendMessage) -> SendResult:
            record = NewEvent(
                kind=EventKind.STEERING_MESSAGE,
                turn=1,
                data={"text": send.message[0].text, "forwarded": send.forwarded},
                source=send.source,
            )
            answered = [(send.forwarded, task.id)] if send.forwarded is not None else []
            side.store.append(child_id, [record], answer_steered=answered)
            return SendResult(route="steered", task_id=task.id)

        return answer

    return bind


def conflicts(side: Side) -> Callable[[str, SendMessage], SendResult]:
    """As a resume that finds the child held by another live runtime, every time."""

    def answer(child_id: str, send: SendMessage) -> SendResult:
        raise ClaimConflict("held elsewhere", child_id=child_id, runtime_id="elsewhere")

    return answer


def _child(store: SqlStore) -> str:
    child_id = str(uuid.uuid4())
    store.create_child(ChildMeta(child_id=child_id, parent_session=PARENT, depth=1))
    return child_id


def _held_by(side: Side, child_id: str) -> TaskSnapshot:
    """``side`` runs ``child_id``: its Task admitted with the claim."""
    task = _task(child_id, side.runtime)
    side.router.claim(task)
    return task


def _status(store: SqlStore, task_id: str) -> TaskStatus | None:
    task = store.ledger.get(task_id)
    return None if task is None else task.status


def _send(text: str = "hello") -> SendMessage:
    registry = AgentRegistry()
    return SendMessage(
        parent=registry.register(PARENT),
        message=(TextBlock(text=text),),
        source=MessageSource(kind="coordinator", sender_session_id=PARENT),
    )


# -- sends from here -------------------------------------------------------------------


def test_a_child_this_runtime_can_claim_is_delivered_here_and_resumed(
    runtimes: Runtimes,
) -> None:
    b = runtimes.open(resumes)
    child = _child(b.store)

    sent = b.router.send(child, _send())

    assert sent.route == "started"
    assert [c for c, _ in b.here.sends] == [child]
    task = b.store.ledger.get(sent.task_id)
    assert task is not None
    assert task.runtime_id == b.runtime.id


def test_a_child_held_by_another_live_runtime_on_sqlite_is_refused_naming_it(
    url: str, runtimes: Runtimes
) -> None:
    if _postgres(url):
        pytest.skip("PostgreSQL forwards instead (the next test)")
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    child = _child(a.store)
    _held_by(a, child)

    with raises(ErrorCode.OWNERSHIP_CONFLICT, match=a.runtime.id):
        b.router.send(child, _send())
    assert len(b.here.sends) == 1  # refused once, not routed again
    assert a.here.sends == []


def test_a_child_held_by_another_live_runtime_on_postgresql_is_steered_there(
    url: str, runtimes: Runtimes
) -> None:
    if not _postgres(url):
        pytest.skip("forwarding is PostgreSQL's")
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    child = _child(a.store)
    held = _held_by(a, child)
    a.here.answer = steers(held)(a)  # its activation runs there now

    first = b.router.send(child, _send("first"))
    second = b.router.send(child, _send("second"))

    assert first == second == SendResult(route="steered", task_id=held.id)
    # The first found the child held here, then went there; the second went straight there.
    assert len(b.here.sends) == 1
    served = [send for _, send in a.here.sends]
    assert [s.message[0].text for s in served] == ["first", "second"]
    assert all(s.forwarded is not None and s.parent.session_id == PARENT for s in served)


def test_a_child_of_a_dead_runtime_is_taken_over_and_resumed_here(
    runtimes: Runtimes,
) -> None:
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    child = _child(a.store)
    held = _held_by(a, child)
    a.store.ledger.close_runtime(a.runtime.id)  # dead to the others at once

    sent = b.router.send(child, _send())

    assert sent.route == "started"
    assert _status(b.store, held.id) is TaskStatus.INTERRUPTED
    assert a.here.sends == []


def test_a_send_that_finds_the_child_held_in_every_race_is_not_delivered(
    url: str, runtimes: Runtimes
) -> None:
    if not _postgres(url):
        pytest.skip("on SQLite the first conflict is the answer")
    b = runtimes.open(conflicts)
    child = _child(b.store)  # nobody holds it by the time the router looks

    with raises(ErrorCode.NOT_DELIVERED, match="kept moving"):
        b.router.send(child, _send())
    assert len(b.here.sends) == _CLAIM_RACES


# -- sends from other runtimes ---------------------------------------------------------


def test_a_forwarded_message_is_delivered_here_as_a_steer_and_refused_once_closing(
    runtimes: Runtimes,
) -> None:
    a = runtimes.open(lambda side: lambda child_id, send: SendResult(route="steered", task_id="t"))
    item = InboxItem(
        inbox_id="inbox-1",
        kind="send",
        child_id="child-1",
        sender_runtime="runtime-b",
        parent_session=PARENT,
        message=[{"type": "text", "text": "hi"}],
        source={"kind": "human"},
    )

    assert a.router.serve_forwarded(item) == SendResult(route="steered", task_id="t")
    ((child_id, send),) = a.here.sends
    assert (child_id, send.forwarded, send.parent.session_id) == ("child-1", "inbox-1", PARENT)
    assert send.source.kind == "human"

    a.router.stop_serving()
    with raises(ErrorCode.CLOSED):
        a.router.serve_forwarded(item)
    assert len(a.here.sends) == 1


# -- kills of Tasks elsewhere ----------------------------------------------------------


def test_a_kill_of_a_dead_runtime_s_task_settles_it_interrupted_now(runtimes: Runtimes) -> None:
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    child = _child(a.store)
    held = _held_by(a, child)
    a.store.ledger.close_runtime(a.runtime.id)

    b.router.kill_elsewhere(held, "killed by parent")

    assert _status(b.store, held.id) is TaskStatus.INTERRUPTED
    assert a.here.kills == []


def test_a_kill_of_a_live_runtime_s_task_is_refused_on_sqlite_and_forwarded_on_postgresql(
    url: str, runtimes: Runtimes
) -> None:
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    child = _child(a.store)
    held = _held_by(a, child)

    if _postgres(url):
        b.router.kill_elsewhere(held, "killed by parent")
        assert a.here.kills == [(held.id, "killed by parent")]
    else:
        with raises(ErrorCode.OWNERSHIP_CONFLICT, match=a.runtime.id):
            b.router.kill_elsewhere(held, "killed by parent")
    assert _status(b.store, held.id) is TaskStatus.RUNNING  # A settles it, not B


# -- construction ----------------------------------------------------------------------


def test_the_task_service_built_on_the_router_claims_and_kills_with_no_further_wiring(
    runtimes: Runtimes,
) -> None:
    a, b = runtimes.open(resumes), runtimes.open(resumes)
    tasks = TaskService(
        ledger=b.store.ledger,
        runtime_id=b.runtime.id,
        routing=b.router,
        interrupter=b.runtime.interrupt_fenced,
    )
    tasks.attach_surface("test")
    mine, theirs = _child(b.store), _child(a.store)
    held = _held_by(a, theirs)
    a.store.ledger.close_runtime(a.runtime.id)

    _, fence = tasks.claim(label="x", owner=PARENT, child_id=mine, signal=CancelSignal())
    tasks.kill(held.id, requester=PARENT)

    assert fence is not None  # claimed through the router
    assert _status(b.store, held.id) is TaskStatus.INTERRUPTED  # killed through it
    wired_later = [n for obj in (tasks, b.runtime, b.router) for n in _WIRING if hasattr(obj, n)]
    assert wired_later == []


def test_the_control_plane_s_objects_are_wired_by_their_constructors_only(url: str) -> None:
    with SubagentControl.open(url) as control:
        parts = (control._tasks, control._runtime, control._router, control._forwarder)
        assert not [name for obj in parts for name in _WIRING if hasattr(obj, name)]
        assert control._tasks._routing is control._router
