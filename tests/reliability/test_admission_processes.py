"""SPEC §11 "Concurrency limits" across real OS processes on one store (SQLite and
PostgreSQL): the limit holds across three runtimes at once, and a runtime SIGKILLed while
it holds the head of the queue loses nothing (another runtime adopts its queued Tasks).

Every run holds one of the limit's slot files (``flock``) while it acts
(``admission_child.py``): a run that finds them all held is a violation, in any process.
Every process a test starts is reaped, pass or fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane import (
    ErrorCode,
    EventKind,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from tests.reliability.admission_child import PARENT, ProbedProvider, SlotProbe
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually

pytestmark = pytest.mark.slow

reaped = pytest.fixture(reaping, name="reaped")

SCRIPT = Path(__file__).with_name("admission_child.py")
LIMIT = 2
PER_PROCESS = 4


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


def _runtime(reaped: Reaper, url: str, probe: Path, name: str, turn_s: float) -> LinesProcess:
    process = reaped.add(
        LinesProcess(SCRIPT, url, str(probe), name, str(LIMIT), str(turn_s), name=name)
    )
    process.expect("ready ")
    return process


def test_the_limit_holds_across_three_processes(reaped: Reaper, url: str, tmp_path: Path) -> None:
    probe = tmp_path / "slots"
    probe.mkdir()
    runtimes = [_runtime(reaped, url, probe, f"rt{i}", 0.15) for i in range(3)]

    for runtime in runtimes:
        runtime.say(f"go {PER_PROCESS}")
    queued = sum(int(runtime.expect("queued ")) for runtime in runtimes)
    statuses = [runtime.expect("done ").split(",") for runtime in runtimes]

    violations = probe / "violations.log"
    assert not violations.exists(), violations.read_text()
    assert statuses == [["completed"] * PER_PROCESS] * 3
    # 12 starts against 2 slots: most of them had to wait (the limit was exercised).
    assert queued >= 3 * PER_PROCESS - 2 * LIMIT
    for runtime in runtimes:
        runtime.say("quit")
        runtime.expect("closed")


def test_a_sigkilled_runtime_holding_the_queue_head_loses_nothing(
    reaped: Reaper, url: str, tmp_path: Path
) -> None:
    probe = tmp_path / "slots"
    probe.mkdir()
    doomed = _runtime(reaped, url, probe, "doomed", 0.01)
    doomed.say("idle")
    idle_child = doomed.expect("idle ")
    doomed.say("hold")
    doomed.say("hold")  # both slots held by runs that never end on their own
    held = [doomed.expect("holding "), doomed.expect("holding ")]
    doomed.say("queue-start")
    queued_child, queued_start, status = doomed.expect("queued ").split()
    assert status == TaskStatus.QUEUED.value
    doomed.say(f"queue-resume {idle_child}")
    queued_resume, status = doomed.expect("queued ").split()
    assert status == TaskStatus.QUEUED.value

    survivor = SubagentControl.open(url, lease_ttl_s=3.0, concurrency={"fake": LIMIT})
    try:
        provider = ProbedProvider(SlotProbe(probe, LIMIT), 0.01)
        survivor.providers.register(provider)
        doomed.reap()  # SIGKILL: its held runs' slots must free, its queue must not be lost

        for task_id in held:
            interrupted = survivor.tasks.wait(task_id, timeout=WAIT_S, requester=PARENT)
            assert interrupted.status is TaskStatus.INTERRUPTED
        started = survivor.tasks.wait(queued_start, timeout=WAIT_S, requester=PARENT)
        resumed = survivor.tasks.wait(queued_resume, timeout=WAIT_S, requester=PARENT)

        assert started.status is TaskStatus.COMPLETED, started
        assert resumed.status is TaskStatus.COMPLETED, resumed
        assert started.runtime_id == resumed.runtime_id == survivor.runtime_id
        assert survivor.store is not None
        first = survivor.store.load(queued_child).events
        prompts = [e for e in first if e.kind == EventKind.USER_MESSAGE]
        assert [e.data for e in prompts] == [{"text": "doomed-queued"}]  # once, adopted
        later = survivor.store.load(idle_child).events
        adopted = [
            e for e in later if e.kind == EventKind.USER_MESSAGE and "adopt me" in str(e.data)
        ]
        assert len(adopted) == 1
        assert not (probe / "violations.log").exists()
    finally:
        survivor.close()


def test_a_runtime_without_limits_settles_a_dead_runtimes_queued_tasks_interrupted(
    reaped: Reaper, url: str, tmp_path: Path
) -> None:
    probe = tmp_path / "slots"
    probe.mkdir()
    doomed = _runtime(reaped, url, probe, "doomed", 0.01)
    doomed.say("hold")
    doomed.say("hold")
    held = [doomed.expect("holding "), doomed.expect("holding ")]
    doomed.say("queue-start")
    _child, queued, _status = doomed.expect("queued ").split()

    # No limits: it cannot adopt; recovery off: the held runs are settled, not left
    # running for a runtime with their provider (SPEC §9 "Recovery").
    survivor = SubagentControl.open(url, lease_ttl_s=3.0, recover=False)
    try:
        doomed.reap()

        settled = survivor.tasks.wait(queued, timeout=WAIT_S, requester=PARENT)
        assert settled.status is TaskStatus.INTERRUPTED
        assert settled.outcome is not None
        assert "interrupted" in (settled.outcome.detail or "")
        for task_id in held:
            assert survivor.tasks.wait(task_id, timeout=WAIT_S, requester=PARENT).status is (
                TaskStatus.INTERRUPTED
            )
    finally:
        survivor.close()


def test_a_dead_runtimes_queued_resume_keeps_its_message_when_a_send_takes_its_child_over(
    reaped: Reaper, url: str, tmp_path: Path
) -> None:
    """The queued resume was answered ``started``: its message was delivered, so it is in
    the child's transcript whoever ends its wait. Here its runtime dies and a runtime with
    no limits (it cannot adopt) continues the child with a message of its own: the queued
    message stays in its own turn, closed ``interrupted``, before the new one."""
    probe = tmp_path / "slots"
    probe.mkdir()
    doomed = _runtime(reaped, url, probe, "doomed", 0.01)
    doomed.say("idle")
    child = doomed.expect("idle ")
    doomed.say("hold")
    doomed.say("hold")
    [doomed.expect("holding "), doomed.expect("holding ")]
    doomed.say(f"queue-resume {child}")
    queued, status = doomed.expect("queued ").split()
    assert status == TaskStatus.QUEUED.value

    survivor = SubagentControl.open(url, lease_ttl_s=3.0)
    try:
        survivor.providers.register(ProbedProvider(SlotProbe(probe, LIMIT), 0.01))
        parent = survivor.agents.register(PARENT)
        doomed.reap()
        sent: list[str] = []

        def taken_over() -> bool:
            try:
                result = survivor.send_message(parent, child, [TextBlock(text="after")])
            except SubagentControlError as exc:  # the dead runtime's claim, until judged
                if exc.code not in (ErrorCode.OWNERSHIP_CONFLICT, ErrorCode.NOT_DELIVERED):
                    raise
                return False
            sent.append(result.task_id)
            return True

        eventually(taken_over, "a send took the dead runtime's child over", timeout=30.0)
        after = survivor.tasks.wait(sent[0], timeout=WAIT_S, requester=PARENT)
        assert after.status is TaskStatus.COMPLETED, after
        stranded = survivor.tasks.wait(queued, timeout=WAIT_S, requester=PARENT)
        assert stranded.status is TaskStatus.INTERRUPTED, stranded

        assert survivor.store is not None
        events = survivor.store.load(child).events
        messages = [(e.turn, e.data) for e in events if e.kind == EventKind.USER_MESSAGE]
        assert [data for _turn, data in messages][-2:] == [{"text": "adopt me"}, {"text": "after"}]
        adopt_turn = messages[-2][0]
        ends = {e.turn: e.data for e in events if e.kind == EventKind.TURN_END}
        assert ends[adopt_turn]["status"] == TaskStatus.INTERRUPTED.value
        assert messages[-1][0] == adopt_turn + 1
    finally:
        survivor.close()
