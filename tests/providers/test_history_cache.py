"""A resumed child's conversation goes on from the one its last resume rebuilt: the same as
rebuilding the whole transcript, whatever was written since and by whom."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    NewEvent,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.providers._chat_history import STEERING_SEEN, chat_history_with_unanswered
from controlplane.providers._history_cache import HistoryCache
from persistence import SqlStore
from tests.support import WAIT_S

from .fakes import COORDINATOR, USER

_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _transcript() -> list[SessionEvent]:
    """Four turns: tool calls (one left open, answered late in the next turn), steering
    held back to the reply that read it, a turn that ends mid-call."""
    specs: list[tuple[int, str, dict[str, Any]]] = [
        (1, EventKind.TURN_START, {}),
        (1, EventKind.USER_MESSAGE, {"text": "one"}),
        (1, EventKind.ASSISTANT_MESSAGE, {"text": "", STEERING_SEEN: 0}),
        (1, "tool/call", {"id": "a", "name": "fetch", "arguments": {"url": "u"}}),
        (1, "tool/call", {"id": "b", "name": "fetch", "arguments": {"url": "v"}}),
        (1, "tool/result", {"id": "a", "output": "ok"}),
        (1, EventKind.STEERING_MESSAGE, {"text": "also this"}),
        (1, EventKind.ASSISTANT_MESSAGE, {"text": "done one", STEERING_SEEN: 0}),
        (1, EventKind.TURN_END, {}),
        (2, EventKind.TURN_START, {}),
        (2, EventKind.USER_MESSAGE, {"text": "two"}),
        (2, "tool/result", {"id": "b", "error": "cut off", "interrupted": True}),
        (2, EventKind.ASSISTANT_MESSAGE, {"text": "done two", STEERING_SEEN: 0}),
        (2, EventKind.TURN_END, {}),
        (3, EventKind.TURN_START, {}),
        (3, EventKind.USER_MESSAGE, {"text": "three"}),
        (3, EventKind.ASSISTANT_MESSAGE, {"text": "", STEERING_SEEN: 0}),
        (3, "tool/call", {"id": "c", "name": "fetch", "arguments": {}}),
        (4, EventKind.TURN_START, {}),
        (4, EventKind.USER_MESSAGE, {"text": "four"}),
        (4, EventKind.STEERING_MESSAGE, {"text": "and that"}),
        (4, EventKind.ASSISTANT_MESSAGE, {"text": "done four", STEERING_SEEN: 1}),
        (4, EventKind.TURN_END, {}),
    ]
    return [
        SessionEvent(
            seq=seq,
            turn=turn,
            kind=kind,
            data=data,
            source=(USER if kind == EventKind.USER_MESSAGE else COORDINATOR)
            if "message" in kind and kind != EventKind.ASSISTANT_MESSAGE
            else None,
            created_at=_AT,
        )
        for seq, (turn, kind, data) in enumerate(specs, start=1)
    ]


def test_going_on_from_any_earlier_resume_rebuilds_what_the_whole_transcript_does() -> None:
    events = _transcript()
    for cut in range(1, len(events) + 1):
        cache = HistoryCache()
        cache.rebuild("c1", events[:cut])
        assert cache.rebuild("c1", events) == chat_history_with_unanswered(events), cut
        assert cache.rebuild("c1", events) == chat_history_with_unanswered(events), cut


def test_a_conversation_gone_on_from_a_kept_one_weighs_what_it_weighs_rebuilt_whole() -> None:
    # The kept weight grows by the new messages only, and is weighed whole again when an
    # answer replaced a placeholder (turn 2's late result for call "b").
    events = _transcript()
    for cut in range(1, len(events)):
        cache = HistoryCache()
        cache.rebuild("c1", events[:cut])
        cache.rebuild("c1", events)
        whole = HistoryCache()
        whole.rebuild("c1", events)
        assert cache._bytes == whole._bytes, cut


def test_a_transcript_that_does_not_continue_the_kept_one_is_rebuilt_whole() -> None:
    events = _transcript()
    cache = HistoryCache()
    cache.rebuild("c1", events[:12])
    # Another child under the same id (its first event differs), a transcript whose event
    # at the kept one's last place differs, a shorter one, one that goes on in the turn
    # the kept rebuild ended: each rebuilt from its first event.
    later = events[0].model_copy(update={"created_at": datetime(2026, 2, 1, tzinfo=UTC)})
    for other in (
        [later, *events[1:]],
        [*events[:11], events[11].model_copy(update={"data": {"id": "b", "output": "x"}})],
        events[:5],
        [*events[:12], events[4].model_copy(update={"seq": 13, "turn": 2})],
    ):
        assert cache.rebuild("c1", other) == chat_history_with_unanswered(other)
        cache.rebuild("c1", events[:12])


def test_the_cache_keeps_at_most_its_bounds() -> None:
    events = _transcript()
    cache = HistoryCache(max_children=2, max_messages=1_000)
    for n in range(5):
        cache.rebuild(f"c{n}", events)
    assert len(cache) == 2
    small = HistoryCache(max_messages=3)
    small.rebuild("c1", events)
    assert len(small) == 0


def test_the_cache_is_bounded_by_its_conversations_weight_not_only_their_count() -> None:
    # Long tool outputs: two conversations of ~40 KB fit a 100 KB weight, a third evicts
    # the oldest, and one heavier than the whole bound is rebuilt and handed out, not kept.
    def long(n: int) -> list[SessionEvent]:
        events = _transcript()
        said = {"text": f"{n} " + "x" * 40_000}
        at = {"turn": 5, "created_at": _AT}
        return [
            *events,
            SessionEvent(seq=len(events) + 1, kind=EventKind.TURN_START, data={}, **at),
            SessionEvent(
                seq=len(events) + 2, kind=EventKind.USER_MESSAGE, data=said, source=USER, **at
            ),
        ]

    cache = HistoryCache(max_bytes=100_000)
    for n in range(3):
        events = long(n)
        assert cache.rebuild(f"c{n}", events) == chat_history_with_unanswered(events)
    assert len(cache) == 2
    heavy = HistoryCache(max_bytes=30_000)
    heavy.rebuild("c1", long(1))
    assert len(heavy) == 0


def _turn(control: SubagentControl, parent: AgentHandle, child_id: str, text: str) -> None:
    sent = control.send_message(parent, child_id, [TextBlock(text=text)])
    done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.COMPLETED


def test_a_turn_written_by_another_runtime_between_turns_is_in_the_next_conversation(
    sqlite_url: str,
) -> None:
    model = ScriptedModel(["first", "second"], keep_calls=10)
    provider = InProcessProvider(model)  # its cache lives across the two control planes
    control = SubagentControl.open(sqlite_url)
    try:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        spec = ContinuableStartSpec(
            provider="inprocess", label="l", prompt=[TextBlock(text="go")], parent=parent
        )
        started = control.start_continuable(spec)
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        _turn(control, parent, started.child_id, "again")  # the provider keeps this conversation
    finally:
        control.close()
    with SqlStore(sqlite_url) as other:  # another runtime's whole turn
        turn = other.load(started.child_id).last_turn + 1
        for batch in (
            [
                NewEvent(kind=EventKind.TURN_START, turn=turn, data={}),
                NewEvent(kind=EventKind.USER_MESSAGE, turn=turn, data={"text": "elsewhere"}),
            ],
            [NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=turn, data={"text": "there"})],
            [NewEvent(kind=EventKind.TURN_END, turn=turn, data={})],
        ):
            other.append(started.child_id, batch)
    control = SubagentControl.open(sqlite_url)
    try:
        control.providers.register(provider)
        _turn(control, control.agents.register("parent-1"), started.child_id, "back")
    finally:
        control.close()
    assert [m.text for m in model.calls[-1].messages] == [
        "go",
        "first",
        "again",
        "second",
        "elsewhere",
        "there",
        "back",
    ]
