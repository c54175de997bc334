"""Checks of a stored transcript's shape, shared by the stress and crash tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane import EventKind, SessionEvent

__all__ = ["Turn", "frame_problems", "turns_of"]


@dataclass
class Turn:
    """The events of one turn (activation) of a child, in order."""

    number: int
    events: list[SessionEvent] = field(default_factory=list)

    @property
    def task_id(self) -> str | None:
        """The Task id recorded in the turn's ``turn/start``."""
        first = self.events[0] if self.events else None
        if first is None or first.kind != EventKind.TURN_START or not isinstance(first.data, dict):
            return None
        task_id = first.data.get("task_id")
        return task_id if isinstance(task_id, str) else None

    @property
    def ended(self) -> bool:
        """Whether the turn's last event is its ``turn/end``."""
        return bool(self.events) and self.events[-1].kind == EventKind.TURN_END


def turns_of(events: Sequence[SessionEvent], seed_length: int = 0) -> list[Turn]:
    """The child's own turns (after its seed), oldest first."""
    turns: dict[int, Turn] = {}
    for event in events[seed_length:]:
        turns.setdefault(event.turn, Turn(event.turn)).events.append(event)
    return [turns[number] for number in sorted(turns)]


def frame_problems(
    events: Sequence[SessionEvent],
    seed_length: int = 0,
    *,
    all_ended: bool,
    interrupted_ok: bool = False,
) -> list[str]:
    """Everything wrong with a transcript's shape; empty when it is sound.

    Sound means: ``seq`` is 1..n without gaps; turns are numbered 1..k in order and never
    interleave; each turn opens with ``turn/start`` then ``user/message`` (turn 1 then the
    descriptor); no turn has two ``turn/start`` or events after its ``turn/end``; and every
    turn but possibly the last has ended (all of them when ``all_ended``; any of them may
    have been interrupted by a crash when ``interrupted_ok``).
    """
    problems = []
    seqs = [event.seq for event in events]
    if seqs != list(range(1, len(events) + 1)):
        problems.append(f"seq is not gapless from 1: {seqs[:5]}…{seqs[-5:]}")
    own = list(events[seed_length:])
    turn_numbers = [event.turn for event in own]
    if turn_numbers != sorted(turn_numbers):
        problems.append("turns interleave")
    turns = turns_of(events, seed_length)
    if [turn.number for turn in turns] != list(range(1, len(turns) + 1)):
        problems.append(f"turn numbers are not 1..k: {[turn.number for turn in turns]}")
    for index, turn in enumerate(turns):
        kinds = [event.kind for event in turn.events]
        expected = [EventKind.TURN_START, EventKind.USER_MESSAGE]
        if turn.number == 1:
            expected.append(EventKind.DESCRIPTOR)
        if kinds[: len(expected)] != expected:
            problems.append(f"turn {turn.number} opens with {kinds[:3]}, not {expected}")
        if kinds.count(EventKind.TURN_START) != 1:
            problems.append(f"turn {turn.number} has {kinds.count(EventKind.TURN_START)} starts")
        if EventKind.TURN_END in kinds and kinds.index(EventKind.TURN_END) != len(kinds) - 1:
            problems.append(f"turn {turn.number} has events after its turn/end")
        is_last = index == len(turns) - 1
        if not turn.ended and not interrupted_ok and (all_ended or not is_last):
            problems.append(f"turn {turn.number} never ended")
    return problems
