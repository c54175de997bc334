"""SPEC §5 send_message 2-5 under load: every message is delivered exactly once or refused.

Many threads fire uniquely-texted `send_message` calls (parent and human sources) at a few
children whose runs step forward only when the load ticks them (`stepping.py`), so each child
keeps cycling through starting, running, settling and idle while messages and kills land in
every phase. Afterwards every message is accounted for against the stored transcripts:

- ``steered``: exactly one ``steering/message`` with its text and source, in the turn of the
  Task the caller was told;
- ``started``: exactly one ``user/message`` opening the turn of the new Task, or, when that
  Task was killed before its run was published, nowhere (the Task reports ``killed``);
- refused (``NOT_DELIVERED``): nowhere in any transcript.

The provider counts live activations per child under a lock: never more than one.

Set ``SUBAGENT_CONTROL_RELIABILITY_SUMMARY`` to a file path to get the run's figures as JSON
(docs/reliability.md quotes them); ``SUBAGENT_CONTROL_STRESS_SEED`` picks another workload.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

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
from tests.reliability.stepping import Clock, Phase, SteppingProvider
from tests.reliability.support import write_summary
from tests.reliability.transcripts import frame_problems, turns_of

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
    kills: Counter[str] = field(default_factory=Counter)
    errors: list[BaseException] = field(default_factory=list)
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
        try:
            barrier.wait(SETTLE_S)
            for number in range(self.sends_per_thread):
                child_id = rng.choice(self.children)
                if rng.random() < KILL_RATE:
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
                self._cond.notify_all()

    def _kill_latest(self, child_id: str) -> None:
        with self._cond:
            task_id = self.latest_task[child_id]
        self.control.tasks.kill(task_id, requester=self.parent)

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
    control: SubagentControl, load: Load, tasks: dict[str, TaskSnapshot]
) -> tuple[Counter[str], list[str]]:
    """Check every message and transcript; return the tallies and the violations."""
    assert control.store is not None
    tally: Counter[str] = Counter()
    violations: list[str] = []
    # text -> (child, turn task id, kind, source) for every inbound message stored.
    stored: dict[str, list[tuple[str, str | None, str, MessageSource | None]]] = {}
    published: set[str] = set()
    for child_id in load.children:
        loaded = control.store.load(child_id)
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
        problem = _check(sent, where, published, tasks, tally)
        if problem:
            violations.append(f"{sent.text!r} ({sent.phase}): {problem}; stored as {where}")
    return tally, violations


def _check(
    sent: Sent,
    where: list[tuple[str, str | None, str, MessageSource | None]],
    published: set[str],
    tasks: dict[str, TaskSnapshot],
    tally: Counter[str],
) -> str | None:
    if sent.code is not None:
        tally[f"refused/{sent.code.value}"] += 1
        tally[f"phase/{sent.phase}/refused"] += 1
        if sent.code is not ErrorCode.NOT_DELIVERED:
            return f"refused with {sent.code}, which this workload never warrants"
        return "refused but stored" if where else None
    assert sent.task_id is not None
    if sent.route == "started" and sent.task_id not in published:
        tally["started/killed before publication"] += 1
        task = tasks.get(sent.task_id)
        if task is None or task.status is not TaskStatus.KILLED:
            return f"started Task never published yet is {task and task.status}"
        return "stored although its Task never published" if where else None
    tally[f"delivered/{sent.route}"] += 1
    tally[f"phase/{sent.phase}/{sent.route}"] += 1
    kind = EventKind.STEERING_MESSAGE if sent.route == "steered" else EventKind.USER_MESSAGE
    expected = (sent.child_id, sent.task_id, kind, sent.source)
    if where != [expected]:
        return f"{sent.route} to {sent.task_id} but not stored exactly once there"
    return None


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# Sends per sender thread on each backend: sized so the whole test stays within ~30 s.
SENDS_PER_THREAD = {"sqlite": 500, "postgres": 300}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_thousands_of_concurrent_sends_are_each_delivered_once_or_refused_and_never_lost(
    backend: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url"))
    sends_per_thread = SENDS_PER_THREAD[backend]
    clock = Clock()
    provider = SteppingProvider(clock, seed=SEED)
    began = time.monotonic()
    control = SubagentControl.open(url)
    try:
        control.providers.register(provider)
        parent = control.agents.register("stress-parent")
        children, latest = start_children(control, parent, CHILDREN)
        load = Load(control, parent, provider, children, sends_per_thread, latest)
        load.run()
        assert not load.errors, load.errors
        clock.drain()
        for task in control.tasks.list(parent):
            control.tasks.wait(task.id, timeout=SETTLE_S, requester=parent)
        still_running = [t.id for t in control.tasks.list(parent) if not t.status.is_terminal]
        tasks = {task.id: task for task in control.tasks.list(parent)}
        tally, violations = account(control, load, tasks)
    finally:
        control.close()
    after_close = control.tasks.list(parent)
    elapsed = time.monotonic() - began

    tally["tasks"] = len(tasks)
    summary = {
        "seed": SEED,
        "threads": THREADS,
        "children": CHILDREN,
        "backend": backend,
        "elapsed_s": round(elapsed, 2),
        "max_live_activations_per_child": max(provider.max_live.values()),
        "activations_entered": provider.entered,
        "starts_rolled_back": provider.rollbacks,
        "kills_by_phase": dict(load.kills),
        "counts": dict(sorted(tally.items())),
        "violations": len(violations),
    }
    write_summary("stress", backend, summary)

    assert violations == [], violations[:20]
    assert tally["sent"] == THREADS * sends_per_thread
    assert max(provider.max_live.values()) == 1, provider.max_live
    assert still_running == []
    assert all(task.status.is_terminal and task.outcome for task in after_close)
    # One Task per start and per `started` reply: a steer never made a second Task.
    assert len(tasks) == CHILDREN + sum(1 for s in load.sent if s.route == "started")
    # The workload really reached every phase, and both routes and refusals happened.
    for phase in ("starting", "running", "settling", "idle"):
        assert tally[f"phase/{phase}"] > 0, f"no message was sent while {phase}"
    assert tally["delivered/steered"] > 0
    assert tally["delivered/started"] > 0
    assert tally["refused/NOT_DELIVERED"] > 0
