"""A resume's claim writes its turn's frame (SPEC §9: the message is durable before
``started``): in the claim's transaction, as the child's next turn — after sealed turns,
after a dead runtime's open turn it closes, after a turn whose end is long — and never
for a Task whose owner is not the child's parent."""

from __future__ import annotations

import uuid

from controlplane.contract import (
    ChildMeta,
    EventKind,
    MessageSource,
    NewEvent,
    TaskSnapshot,
    TaskStatus,
    utcnow,
)
from persistence import SqlStore

PARENT = "parent-1"
RUNTIME = "runtime-gone"


def child(store: SqlStore) -> str:
    child_id = str(uuid.uuid4())
    meta = ChildMeta(
        child_id=child_id, parent_session=PARENT, depth=1, seed_length=0, label="c",
        created_at=utcnow(),
    )  # fmt: skip
    store.create_child(meta, [NewEvent(kind=EventKind.TURN_START, turn=1, data={"task_id": "t0"})])
    return child_id


def closed_turn(store: SqlStore, child_id: str, turn: int, *, end_data: dict[str, object]) -> None:
    store.append(
        child_id,
        [
            *([] if turn == 1 else [NewEvent(kind=EventKind.TURN_START, turn=turn, data={})]),
            NewEvent(kind=EventKind.USER_MESSAGE, turn=turn, data={"text": f"m{turn}"}),
            NewEvent(kind=EventKind.TURN_END, turn=turn, data=end_data),
        ],
    )


def resume(owner: str, child_id: str) -> TaskSnapshot:
    return TaskSnapshot(
        id=str(uuid.uuid4()), label="go on", owner_session=owner, status=TaskStatus.RUNNING,
        child_id=child_id, runtime_id=RUNTIME, created_at=utcnow(),
    )  # fmt: skip


def opening(task: TaskSnapshot) -> list[NewEvent]:
    return [
        NewEvent(kind=EventKind.TURN_START, turn=0, data={"task_id": task.id}),
        NewEvent(
            kind=EventKind.USER_MESSAGE, turn=0, data={"text": "go on"},
            source=MessageSource(kind="coordinator", sender_session_id=PARENT),
        ),
    ]  # fmt: skip


def test_the_frame_opens_the_turn_after_the_last_sealed_one(store_url: str) -> None:
    with SqlStore(store_url) as store:
        child_id = child(store)
        closed_turn(store, child_id, 1, end_data={"status": "completed"})
        closed_turn(store, child_id, 2, end_data={"status": "completed"})
        task = resume(PARENT, child_id)

        assert store.admit_claiming(task, is_dead=lambda *_: True, opening=opening(task))

        events = store.load(child_id).events
        assert [(e.turn, e.kind) for e in events[-2:]] == [
            (3, EventKind.TURN_START),
            (3, EventKind.USER_MESSAGE),
        ]
        assert events[-2].data == {"task_id": task.id}
        assert events[-1].source is not None
        assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_a_long_turn_end_is_read_whole(store_url: str) -> None:
    with SqlStore(store_url) as store:
        child_id = child(store)
        closed_turn(store, child_id, 1, end_data={"status": "completed", "note": "x" * 9000})
        task = resume(PARENT, child_id)

        store.admit_claiming(task, is_dead=lambda *_: True, opening=opening(task))

        assert [e.turn for e in store.load(child_id).events[-2:]] == [2, 2]


def test_a_turn_end_whose_text_looks_like_another_event_is_not_misread(store_url: str) -> None:
    with SqlStore(store_url) as store:
        child_id = child(store)
        # Its own seq (3) and a later "turn" inside its text: only the event itself counts.
        closed_turn(store, child_id, 1, end_data={"status": "completed", "n": '[3,9,"turn/end",'})
        task = resume(PARENT, child_id)

        store.admit_claiming(task, is_dead=lambda *_: True, opening=opening(task))

        assert [e.turn for e in store.load(child_id).events[-2:]] == [2, 2]


def test_a_dead_runtimes_open_turn_is_closed_first(store_url: str) -> None:
    with SqlStore(store_url) as store:
        child_id = child(store)
        closed_turn(store, child_id, 1, end_data={"status": "completed"})
        first = resume(PARENT, child_id)
        fence = store.admit_claiming(first, is_dead=lambda *_: True, opening=opening(first))
        assert fence is not None
        second = resume(PARENT, child_id)

        store.admit_claiming(second, is_dead=lambda *_: True, opening=opening(second))

        events = store.load(child_id).events
        assert [(e.turn, e.kind) for e in events[-5:]] == [
            (2, EventKind.TURN_START),
            (2, EventKind.USER_MESSAGE),
            (2, EventKind.TURN_END),
            (3, EventKind.TURN_START),
            (3, EventKind.USER_MESSAGE),
        ]
        assert events[-3].data["status"] == "interrupted"
        got = store.ledger.get(first.id)
        assert got is not None
        assert got.status is TaskStatus.INTERRUPTED


def test_a_strangers_message_is_not_written(store_url: str) -> None:
    with SqlStore(store_url) as store:
        child_id = child(store)
        closed_turn(store, child_id, 1, end_data={"status": "completed"})
        before = store.load(child_id).events
        task = resume("someone-else", child_id)

        store.admit_claiming(task, is_dead=lambda *_: True, opening=opening(task))

        assert store.load(child_id).events == before
