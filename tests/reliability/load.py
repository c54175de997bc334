"""The load generator and the accounting of the stress tests (see test_stress.py).

`Load` runs sender threads that fire uniquely-texted `send_message` calls, with kills mixed
in, at a few children of a `SteppingProvider`; `account` then checks every message against the
stored transcripts and returns the tallies and the violations.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from persistence import SqlStore
from tests.reliability.stepping import Phase, SteppingProvider
from tests.reliability.transcripts import frame_problems, turns_of

__all__ = ["CHILDREN", "SEED", "SETTLE_S", "THREADS", "Load", "Sent", "account", "start_children"]

SEED = int(os.environ.get("SUBAGENT_CONTROL_STRESS_SEED", "20240607"))
THREADS = 12
CHILDREN = 4
KILL_RATE = 0.04
HUMAN_RATE = 0.25
SETTLE_S = 30.0


@dataclass
class Sent:
    """One `send_message` call and what its caller was told."""

    text: str
    child_id: str
    source: MessageSource
    phase: Phase
    route: str | None = None
    task_id: str | None = None
    code: ErrorCode | None = None


@dataclass
class Load:
    """The load generator: sender threads plus a backstop that keeps the clock moving."""

    control: SubagentControl
    parent: AgentHandle
    provider: SteppingProvider
    children: list[str]
    sends_per_thread: int
    latest_task: dict[str, str]
    sent: list[Sent] = field(default_factory=list)
    kill_rate: float = KILL_RATE
    """How often a sender kills its child's newest Task before a send."""
    pace_s: float = 0.0
    """A sender's mean pause after each send (0: none): a paced load lasts long enough for
    faults to land among its turns."""
    kills: Counter[str] = field(default_factory=Counter)
    errors: list[BaseException] = field(default_factory=list)
    # Called (once, from a sender) when this many sends have been answered, e.g. to close.
    at_count: tuple[int, Callable[[], None]] | None = None
    _answered: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _in_flight: int = 0
    _active: int = THREADS
    _done: bool = False

    def run(self) -> None:
        """Fire every sender at once and return when all have finished."""
        barrier = threading.Barrier(THREADS)
        senders = [
            threading.Thread(target=self._sender, args=(index, barrier), daemon=True)
            for index in range(THREADS)
        ]
        backstop = threading.Thread(target=self._backstop, daemon=True)
        backstop.start()
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(SETTLE_S * 3)
            assert not thread.is_alive(), "a sender never returned (a lost reply?)"
        with self._cond:
            self._done = True
            self._cond.notify_all()
        backstop.join(SETTLE_S)

    def _sender(self, index: int, barrier: threading.Barrier) -> None:
        rng = random.Random(f"{SEED}:sender:{index}")
        mine: list[Sent] = []
        kills: Counter[str] = Counter()
        clock = self.provider.clock
        pause = threading.Event()  # never set: the pace between sends
        try:
            barrier.wait(SETTLE_S)
            for number in range(self.sends_per_thread):
                child_id = rng.choice(self.children)
                if rng.random() < self.kill_rate:
                    kills[self.provider.phase(child_id)] += 1
                    self._kill_latest(child_id)
                human = rng.random() < HUMAN_RATE
                source = MessageSource(
                    kind="human" if human else "coordinator",
                    sender_session_id=self.parent.session_id,
                )
                phase = self.provider.phase(child_id)
                sent = Sent(f"msg {index}-{number}", child_id, source, phase)
                mine.append(sent)
                self._send(sent)
                clock.tick(child_id)
                if self.pace_s:
                    pause.wait(rng.uniform(0, 2 * self.pace_s))  # the pace, not a sync
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            with self._cond:
                self.sent.extend(mine)
                self.kills.update(kills)
                self._active -= 1
                self._cond.notify_all()

    def _send(self, sent: Sent) -> None:
        with self._cond:
            self._in_flight += 1
            self._cond.notify_all()
        try:
            result = self.control.send_message(
                self.parent, sent.child_id, [TextBlock(text=sent.text)], sent.source
            )
        except SubagentControlError as exc:
            sent.code = exc.code
        else:
            sent.route, sent.task_id = result.route, result.task_id
            if result.route == "started":
                with self._cond:
                    self.latest_task[sent.child_id] = result.task_id
        finally:
            with self._cond:
                self._in_flight -= 1
                self._answered += 1
                fire = self.at_count is not None and self._answered == self.at_count[0]
                self._cond.notify_all()
            if fire and self.at_count is not None:
                threading.Thread(target=self.at_count[1], daemon=True).start()

    def _kill_latest(self, child_id: str) -> None:
        with self._cond:
            task_id = self.latest_task[child_id]
        self.control.tasks.kill(task_id, requester=self.parent)  # a no-op once settled

    def _backstop(self) -> None:
        # Senders tick the children they talk to; but a sender whose message is held until
        # publication blocks, and if every sender still at work is blocked nobody ticks.
        # Only then does the backstop tick, pausing briefly between ticks so the starting
        # runs can publish.
        with self._cond:
            while not self._done:
                self._cond.wait_for(
                    lambda: self._done or (self._active > 0 and self._in_flight == self._active)
                )
                if self._done:
                    break
                self.provider.clock.tick_all()
                self._cond.wait(0.001)


def start_children(
    control: SubagentControl, parent: AgentHandle, count: int
) -> tuple[list[str], dict[str, str]]:
    children, latest = [], {}
    for number in range(count):
        start = control.start_continuable(
            ContinuableStartSpec(
                provider="stepping",
                label=f"stress child {number}",
                prompt=[TextBlock(text=f"prompt {number}")],
                parent=parent,
            )
        )
        children.append(start.child_id)
        latest[start.child_id] = start.task_id
    return children, latest


def account(
    store: SqlStore,
    load: Load,
    tasks: dict[str, TaskSnapshot],
    refusals: frozenset[ErrorCode] = frozenset({ErrorCode.NOT_DELIVERED}),
) -> tuple[Counter[str], list[str]]:
    """Check every message and transcript; return the tallies and the violations.

    ``refusals`` are the codes this workload may answer with; any other is a violation.
    """
    tally: Counter[str] = Counter()
    violations: list[str] = []
    # text -> (child, turn task id, kind, source) for every inbound message stored.
    stored: dict[str, list[tuple[str, str | None, str, MessageSource | None]]] = {}
    published: set[str] = set()
    unpublished: set[str] = set()
    for child_id in load.children:
        try:
            loaded = store.load(child_id)
        except SubagentControlError as exc:
            # Killed before its first publication: never durable (SPEC §5 start 4).
            if exc.code is not ErrorCode.CHILD_NOT_FOUND:
                raise
            tally["children never published"] += 1
            unpublished.add(child_id)
            continue
        tally["events"] += len(loaded.events)
        for problem in frame_problems(loaded.events, loaded.meta.seed_length, all_ended=True):
            violations.append(f"child {child_id}: {problem}")
        for turn in turns_of(loaded.events, loaded.meta.seed_length):
            tally["turns"] += 1
            task_id = turn.task_id
            if task_id is None or task_id in published:
                violations.append(f"child {child_id} turn {turn.number}: task id {task_id!r}")
                continue
            published.add(task_id)
            end = turn.events[-1].data
            task = tasks.get(task_id)
            if task is None or not isinstance(end, dict) or end.get("status") != task.status:
                violations.append(f"turn of task {task_id} ended {end!r}, task is {task!r}")
            for event in turn.events:
                if event.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE):
                    text = event.data.get("text") if isinstance(event.data, dict) else None
                    stored.setdefault(str(text), []).append(
                        (child_id, task_id, event.kind, event.source)
                    )
    for sent in load.sent:
        tally["sent"] += 1
        tally[f"phase/{sent.phase}"] += 1
        where = stored.get(sent.text, [])
        # A child killed before its first publication is no child: refused at once.
        allowed = (
            refusals | {ErrorCode.CHILD_NOT_FOUND} if sent.child_id in unpublished else refusals
        )
        problem = _check(sent, where, published, tasks, tally, allowed)
        if problem:
            violations.append(f"{sent.text!r} ({sent.phase}): {problem}; stored as {where}")
    return tally, violations


def _check(
    sent: Sent,
    where: list[tuple[str, str | None, str, MessageSource | None]],
    published: set[str],
    tasks: dict[str, TaskSnapshot],
    tally: Counter[str],
    refusals: frozenset[ErrorCode],
) -> str | None:
    if sent.code is not None:
        tally[f"refused/{sent.code.value}"] += 1
        tally[f"phase/{sent.phase}/refused"] += 1
        if sent.code not in refusals:
            return f"refused with {sent.code}, which this workload never warrants"
        if sent.code is ErrorCode.DURABILITY_FAILED:
            # The one raise that is no refusal: the running turn has the message, the
            # transcript may or may not (SPEC §5); never twice.
            tally[f"durability_failed/{'stored' if where else 'not stored'}"] += 1
            return "stored more than once" if len(where) > 1 else None
        return "refused but stored" if where else None
    assert sent.task_id is not None
    if sent.route == "started" and sent.task_id not in published:
        # A resume's message is written before its provider starts: only a child that was
        # never published (its first start killed) has no turn for it.
        task = tasks.get(sent.task_id)
        outcome = task.outcome if task else None
        if outcome is not None and outcome.code is ErrorCode.NOT_RESUMABLE:
            tally["started/child never published"] += 1
            return "stored although its child never published" if where else None
        if outcome is not None and outcome.status is TaskStatus.INTERRUPTED:
            # Its runtime lost the child (fenced, or taken over) before the message could
            # be written: the Task says so, and nothing of it is stored (SPEC §9 Fencing).
            tally["started/interrupted before its message was recorded"] += 1
            return "stored although its turn never began" if where else None
        return f"started Task has no turn (its message is nowhere), its outcome is {outcome}"
    task = tasks.get(sent.task_id)
    if sent.route == "started" and task is not None and task.status is TaskStatus.KILLED:
        tally["started/killed"] += 1
    tally[f"delivered/{sent.route}"] += 1
    tally[f"phase/{sent.phase}/{sent.route}"] += 1
    kind = EventKind.STEERING_MESSAGE if sent.route == "steered" else EventKind.USER_MESSAGE
    expected = (sent.child_id, sent.task_id, kind, sent.source)
    if where != [expected]:
        return f"{sent.route} to {sent.task_id} but not stored exactly once there"
    return None
