"""`AcpProvider` and the newer session methods: resume, close and steering (SPEC §10).

Each is used only when the agent (`acp_agent.py`, written from the protocol) advertises it:
``session/resume`` before ``session/load`` before a new session primed with the transcript;
``session/close`` when a run ends, bounded; the ``_session/steering`` extension to inject a
follow-up into the running turn, else ``steer`` stays None. The agent logs every method it
is called with (``methods.jsonl``), so the tests assert on what it received.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    CancelSignal,
    ErrorCode,
    EventKind,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.providers._acp import THREAD_PREFIX

pytest.importorskip("acp", reason="the acp extra is not installed")
from controlplane import AcpProvider
from tests.providers.fakes import FakeTranscript, Parent, start_request
from tests.providers.test_acp_provider import (
    Agents,
    alive,
    events,
    reaped,
    register,
    settle,
    start,
)
from tests.support import eventually

pytestmark = pytest.mark.timeout(60)

STEERING = "_session/steering"


class Logged(Agents):
    """`Agents`, plus the methods each agent process was called with."""

    def methods(self) -> list[dict[str, Any]]:
        path = self.state / "methods.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def called(self) -> list[str]:
        return [m["method"] for m in self.methods()]

    def wait_until_waiting(self) -> None:
        """Until a ``--wait-for-steer`` prompt has sent its first chunk and waits."""
        eventually(lambda: (self.state / "waiting").exists(), "the agent waits for a steer")


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Logged]:
    yield from reaped(Logged(tmp_path / "agent-state"))


@pytest.fixture
def control(sqlite_url: str) -> Iterator[SubagentControl]:
    with SubagentControl.open(sqlite_url) as opened:
        yield opened
    assert not [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def two_turns(control: SubagentControl, agents: Logged) -> tuple[str, str | None]:
    """Start a child, settle it, resume it; the child id and the resumed turn's output."""
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "remember otters")
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    again = control.send_message(parent, child_id, [TextBlock(text="what did I say?")])
    assert again.route == "started"
    snapshot = settle(control, again.task_id, parent)
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    return child_id, snapshot.outcome.output


def second_process(agents: Logged) -> list[str]:
    """The methods of the resumed turn's agent process (the second ``initialize`` on)."""
    called = agents.called()
    at = [i for i, method in enumerate(called) if method == "initialize"][1]
    return called[at:]


# -- resume --------------------------------------------------------------------------------


def test_a_resume_uses_session_resume_when_advertised_and_nothing_is_replayed(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--resume-session", "--load-session")  # both: resume wins

    child_id, output = two_turns(control, agents)

    assert second_process(agents) == ["initialize", "session/resume", "session/prompt"]
    first, second = agents.prompts()
    assert second["session"] == first["session"]
    assert second["texts"] == ["what did I say?"]  # no transcript primer: the agent has it
    assert output == "echo: what did I say? (remembered: remember otters)"
    turn_two = [e.kind for e in events(control, child_id) if e.turn == 2]
    assert turn_two == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,
        EventKind.TURN_END,
    ]


def test_a_resume_loads_the_session_when_only_load_is_advertised(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--load-session")

    _, output = two_turns(control, agents)

    assert second_process(agents) == ["initialize", "session/load", "session/prompt"]
    assert output == "echo: what did I say? (remembered: remember otters)"


def test_a_session_the_agent_cannot_resume_falls_back_to_a_new_primed_session(
    control: SubagentControl, agents: Logged
) -> None:
    # It advertises session/resume but has lost the session (its state was wiped between
    # the turns): the resume is refused, so the child goes on in a new, primed session.
    register(control, agents, "--resume-session")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "remember otters")
    settle(control, task_id, parent)
    for saved in agents.state.glob("sess-*.json"):
        saved.unlink()
    again = control.send_message(parent, child_id, [TextBlock(text="what did I say?")])
    snapshot = settle(control, again.task_id, parent)

    assert second_process(agents) == [
        "initialize",
        "session/resume",
        "session/new",
        "session/prompt",
    ]
    first, second = agents.prompts()
    assert second["session"] != first["session"]
    context, prompt = second["texts"]
    assert "User: remember otters" in context
    assert prompt == "what did I say?"
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "echo: what did I say? (context blocks: 1)"
    sessions = [e.data for e in events(control, child_id) if e.kind == "acp/session"]
    assert sessions == [
        {"session_id": first["session"], "reopen": "session/resume"},
        {"session_id": second["session"], "reopen": "session/resume"},
    ]


def test_without_resume_or_load_a_resume_opens_a_new_primed_session(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents)

    _, output = two_turns(control, agents)

    assert second_process(agents) == ["initialize", "session/new", "session/prompt"]
    assert output == "echo: what did I say? (context blocks: 1)"


# -- close ---------------------------------------------------------------------------------


def test_a_run_closes_its_session_before_its_agent_is_ended_when_close_is_advertised(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--close-session")
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")

    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED

    assert agents.called() == ["initialize", "session/new", "session/prompt", "session/close"]
    (prompted,) = agents.prompts()
    assert agents.methods()[-1]["session"] == prompted["session"]
    assert not [pid for pid in agents.pids() if alive(pid)]


def test_no_session_close_is_sent_to_an_agent_that_does_not_advertise_it(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents)
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")
    settle(control, task_id, parent)

    assert agents.called() == ["initialize", "session/new", "session/prompt"]


def test_an_agent_that_hangs_on_close_is_still_reaped_within_the_grace_period(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--close-session", "--hang-on", "session/close", grace_s=0.5)
    parent = control.agents.register("parent-1")
    began = time.monotonic()
    _, task_id = start(control, parent, "hello")

    snapshot = settle(control, task_id, parent)

    assert snapshot.status is TaskStatus.COMPLETED
    # close waits 0.5 s, then EOF, SIGTERM after 0.1 s: well inside the bound.
    assert time.monotonic() - began < 8.0
    assert agents.called()[-1] == "session/close"
    assert not [pid for pid in agents.pids() if alive(pid)]


def test_a_killed_turn_still_closes_its_session(control: SubagentControl, agents: Logged) -> None:
    register(control, agents, "--close-session", "--hang-on", "session/prompt")
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "think forever")
    eventually(lambda: "session/prompt" in agents.called(), "the agent got the prompt")
    control.tasks.kill(task_id, requester=parent)

    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    assert agents.called()[-2:] == ["session/cancel", "session/close"]


# -- steering ------------------------------------------------------------------------------


def test_a_follow_up_is_steered_into_the_running_turn_when_the_agent_offers_steering(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--steering", "--wait-for-steer")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "plan the trip")
    agents.wait_until_waiting()

    sent = control.send_message(parent, child_id, [TextBlock(text="go by train")])

    assert (sent.route, sent.task_id) == ("steered", task_id)
    snapshot = settle(control, task_id, parent)
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "echo: plan the trip (steered: go by train)"
    turn = [(e.kind, e.data) for e in events(control, child_id) if e.turn == 1]
    steering = [data for kind, data in turn if kind == EventKind.STEERING_MESSAGE]
    assert steering == [{"text": "go by train"}]  # once: the provider writes no copy
    replies = [data["text"] for kind, data in turn if kind == EventKind.ASSISTANT_MESSAGE]
    assert replies == [
        "waiting for guidance",
        "noted: go by train",
        "echo: plan the trip (steered: go by train)",
    ]
    kinds = [kind for kind, _ in turn]
    # Written while the steer waited for the agent's answer, yet after its record.
    assert kinds.index(EventKind.STEERING_MESSAGE) < kinds.index(EventKind.ASSISTANT_MESSAGE)
    assert agents.called().count(STEERING) == 1


def test_a_follow_up_the_agent_declines_is_not_delivered_and_not_recorded(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--steering", "--refuse-steering", "--wait-for-steer")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "plan the trip")

    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="go by train")])

    assert caught.value.code is ErrorCode.NOT_DELIVERED
    assert "declined" in str(caught.value)
    assert agents.called().count(STEERING) == 1
    control.tasks.kill(task_id, requester=parent)
    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    kinds = [e.kind for e in events(control, child_id)]
    assert EventKind.STEERING_MESSAGE not in kinds


def test_without_steering_a_follow_up_to_a_running_child_is_not_delivered(
    control: SubagentControl, agents: Logged
) -> None:
    register(control, agents, "--wait-for-steer")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "plan the trip")

    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="go by train")])

    assert caught.value.code is ErrorCode.NOT_DELIVERED
    control.tasks.kill(task_id, requester=parent)
    settle(control, task_id, parent)
    assert STEERING not in agents.called()


def test_a_steer_after_the_turn_settled_is_not_delivered_and_never_reaches_the_agent(
    agents: Logged,
) -> None:
    provider = AcpProvider(agents.command("--steering"), start_timeout_s=10.0, grace_s=1.0)
    transcript = FakeTranscript()
    run = provider.start(start_request(Parent(), transcript, prompt="hello"), CancelSignal())
    try:
        assert run.steer is not None
        assert run.result().stop_reason == "completed"
        with pytest.raises(SubagentControlError) as caught:
            transcript.deliver(run, "too late")
        assert caught.value.code is ErrorCode.NOT_DELIVERED
    finally:
        run.dispose()
    with pytest.raises(SubagentControlError) as disposed:
        transcript.deliver(run, "later still")
    assert disposed.value.code is ErrorCode.NOT_DELIVERED
    assert STEERING not in agents.called()
    assert transcript.texts("steering/message") == []


def test_a_steer_under_the_transcripts_lock_does_not_block_the_agents_writes(
    agents: Logged,
) -> None:
    # `deliver` holds the transcript's lock while the run steers, as the control plane does;
    # the agent writes a reply before it answers the steer, so a run that wrote on its loop
    # would wait for that lock while the lock's holder waited for the loop.
    provider = AcpProvider(
        agents.command("--steering", "--wait-for-steer"),
        start_timeout_s=10.0,
        grace_s=1.0,
        steer_timeout_s=30.0,
    )
    transcript = FakeTranscript()
    run = provider.start(start_request(Parent(), transcript, prompt="plan"), CancelSignal())
    try:
        agents.wait_until_waiting()  # its first chunk is written when the next one comes
        began = time.monotonic()
        transcript.deliver(run, "by train")
        assert time.monotonic() - began < 10.0
        result = run.result()
    finally:
        run.dispose()
    assert result.output == [TextBlock(text="echo: plan (steered: by train)")]
    assert [(w.kind, w.data.get("text")) for w in transcript.written[1:]] == [
        ("steering/message", "by train"),
        (EventKind.ASSISTANT_MESSAGE, "waiting for guidance"),  # blocked behind the steer
        (EventKind.ASSISTANT_MESSAGE, "noted: by train"),
        (EventKind.ASSISTANT_MESSAGE, "echo: plan (steered: by train)"),
    ]


@pytest.mark.slow  # measured: 5 s under load (--durations)
def test_a_steer_racing_the_end_of_the_turn_is_steered_and_answered_or_not_delivered(
    control: SubagentControl, agents: Logged
) -> None:
    # Follow-ups sent back to back from the moment the child starts, until one is refused:
    # each lands in the turn (recorded once, and in the agent's answer) or is not delivered
    # (in neither), whichever side of the turn's end it falls on.
    register(control, agents, "--steering", "--tool-call", "--think", "0.02")
    parent = control.agents.register("parent-1")
    outcomes: dict[str, int] = {"steered": 0, "refused": 0}
    for attempt in range(12):
        child_id, task_id = start(control, parent, f"turn {attempt}")
        steered: list[str] = []
        refusal: ErrorCode | None = None
        for n in range(50):
            text = f"note {attempt}.{n}"
            try:
                sent = control.send_message(parent, child_id, [TextBlock(text=text)])
            except SubagentControlError as exc:
                refusal = exc.code
                outcomes["refused"] += 1
                break
            if sent.route == "started":  # the turn was over before this one: a new turn
                settle(control, sent.task_id, parent)
                break
            assert sent.task_id == task_id
            steered.append(text)
        assert refusal in (None, ErrorCode.NOT_DELIVERED)
        snapshot = settle(control, task_id, parent)
        outcomes["steered"] += len(steered)
        assert snapshot.outcome is not None
        expected = f"echo: turn {attempt}"
        if steered:
            expected += f" (steered: {' | '.join(steered)})"
        assert snapshot.outcome.output == expected
        turn = [e for e in events(control, child_id) if e.turn == 1]
        recorded = [e.data["text"] for e in turn if e.kind == EventKind.STEERING_MESSAGE]
        assert recorded == steered
    # The race was run: some fell inside the turn, some after its end.
    assert outcomes["steered"] > 0
    assert outcomes["refused"] > 0
