"""Lifecycle log lines: every start, publish, steer, kill, settle, retry and takeover names
the child, the Task and the runtime, at a level an operator filters on, and never carries a
message's text at INFO (only its length). They need no OpenTelemetry at all."""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controlplane import AgentHandle, ErrorCode, SubagentControl, SubagentResult
from persistence import RetryPolicy
from tests.fakes import FakeProvider
from tests.support import (
    PARENT_MODEL,
    REPO,
    MakeControl,
    raises,
    running_child,
    settle,
    start_child,
    text,
)

pytestmark = pytest.mark.timeout(60)

LOGGER = "controlplane.lifecycle"
SECRET = "the launch code is 0000"


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def _events(records: list[logging.LogRecord]) -> list[tuple[str, int]]:
    return [(r.subagent_event, r.levelno) for r in records]  # type: ignore[attr-defined]


def test_each_step_of_a_child_s_life_is_one_line_naming_child_task_and_runtime(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    hold: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        child_id, first_task, _plan = running_child(control, parent, provider, hold)
        control.send_message(parent, child_id, text(SECRET))
        control.tasks.kill(first_task, requester=parent)
        settle(control, first_task, parent)
        provider.plan(result=SubagentResult(stop_reason="refusal"))
        resumed = control.send_message(parent, child_id, text(SECRET))
        settle(control, resumed.task_id, parent)

    records = _lines(caplog)
    assert _events(records) == [
        ("start", logging.INFO),
        ("publish", logging.INFO),
        ("steer", logging.INFO),
        ("kill", logging.INFO),
        ("settle", logging.INFO),
        ("start", logging.INFO),
        ("publish", logging.INFO),
        ("settle", logging.WARNING),
    ]
    for record in records:
        assert record.child_id == child_id  # type: ignore[attr-defined]
        assert record.runtime_id == control.runtime_id  # type: ignore[attr-defined]
        message = record.getMessage()
        assert f"child={child_id}" in message
        assert f"runtime={control.runtime_id}" in message
        assert SECRET not in message
    tasks = [r.task_id for r in records]  # type: ignore[attr-defined]
    assert tasks == [first_task] * 5 + [resumed.task_id] * 3
    steer = records[2].getMessage()
    assert f"task={first_task}" in steer
    assert f"chars={len(SECRET)}" in steer
    assert "reason='killed by parent-1'" in records[3].getMessage()
    assert "status=failed" in records[-1].getMessage()
    assert "detail=refusal" in records[-1].getMessage()


def test_a_refused_send_names_its_code_and_not_its_text(
    control: SubagentControl, parent: AgentHandle, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER), raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, "no-such\x00child", text(SECRET))

    (line,) = _lines(caplog)
    assert line.subagent_event == "send refused"  # type: ignore[attr-defined]
    assert "code=INVALID_INPUT" in line.getMessage()
    assert "\x00" not in line.getMessage()  # controls are shown escaped, on one line
    assert SECRET not in line.getMessage()


def test_a_store_retry_names_the_child_and_task_it_was_writing_for(
    make_control: MakeControl,
    provider: FakeProvider,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "retried.db"
    control = make_control(
        f"sqlite:///{path}?timeout=0.01", retry=RetryPolicy.immediate(max_attempts=2)
    )
    owner = control.agents.register("parent-1", model=PARENT_MODEL)
    hold = threading.Event()
    try:
        child_id, task_id, _plan = running_child(control, owner, provider, hold)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with caplog.at_level(logging.INFO, logger=LOGGER), raises(ErrorCode.DURABILITY_FAILED):
                control.send_message(owner, child_id, text(SECRET))
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    finally:
        hold.set()

    retries = [r for r in _lines(caplog) if r.subagent_event == "retry"]  # type: ignore[attr-defined]
    assert len(retries) == 1
    assert retries[0].levelno == logging.WARNING
    assert retries[0].child_id == child_id  # type: ignore[attr-defined]
    assert retries[0].task_id == task_id  # type: ignore[attr-defined]
    assert "cause=busy" in retries[0].getMessage()
    assert f"runtime={control.runtime_id}" in retries[0].getMessage()


@pytest.mark.slow
def test_taking_over_a_dead_runtime_s_task_is_a_warning_naming_both_runtimes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    script = REPO / "tests" / "reliability" / "restart_child.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), url, "30"], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        ready = json.loads(line.removeprefix("READY "))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    # recover=False: the interrupted path's takeover (with recovery on, a runtime with no
    # provider leaves the Task for one that has it, which logs no takeover).
    with caplog.at_level(logging.INFO, logger=LOGGER):
        control = SubagentControl.open(url, recover=False)  # sweeps the dead runtime's Tasks
    control.close()

    (takeover,) = [r for r in _lines(caplog) if r.subagent_event == "takeover"]  # type: ignore[attr-defined]
    assert takeover.levelno == logging.WARNING
    assert takeover.child_id == ready["running_child"]  # type: ignore[attr-defined]
    assert takeover.task_id == ready["running_task"]  # type: ignore[attr-defined]
    assert takeover.runtime_id == control.runtime_id  # type: ignore[attr-defined]
    assert f"dead_runtime={ready['runtime_id']}" in takeover.getMessage()


def test_start_line_names_the_provider_and_the_prompt_length_only(
    control: SubagentControl, parent: AgentHandle, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        started = start_child(control, parent, prompt=SECRET)
        settle(control, started.task_id, parent)

    start = _lines(caplog)[0]
    assert start.subagent_event == "start"  # type: ignore[attr-defined]
    assert "route=initial" in start.getMessage()
    assert "provider=fake" in start.getMessage()
    assert f"chars={len(SECRET)}" in start.getMessage()
    assert all(SECRET not in r.getMessage() for r in _lines(caplog))
