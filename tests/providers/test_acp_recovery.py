"""An ACP child's turn outlives its runtime when its agent can reopen the session.

A runtime (`acp_recovery_child.py`, a process of its own) runs an ACP child whose agent
hangs in its prompt; the runtime is SIGKILLed there (its agent then dies too: the agent's
guard ends it), or closes. Another runtime starts the agent again, reopens the session
(``session/resume``, else ``session/load``, whose replay is not recorded again), sends the
turn's prompt again, and the SAME Task completes in the SAME turn: one ``turn/start``, one
``turn/end``, one ``task/recovered``, the prompt once in the transcript. An agent that
offers neither ends ``interrupted``, saying so, before any agent process is spawned, and
``close()`` kills its runs. The agents are `acp_agent.py` (written from the protocol) and
`sdk_session_agent.py` (built on the ``agent-client-protocol`` SDK's agent side). SQLite
and PostgreSQL; every runtime and agent process a test starts is reaped.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import EventKind, SessionEvent, SubagentControl, TaskStatus, TextBlock

pytest.importorskip("acp", reason="the acp extra is not installed")
from controlplane import AcpProvider
from controlplane.providers._acp_client import SESSION_EVENT
from controlplane.providers._acp_session import Capabilities, open_prompt
from tests.providers.acp_recovery_child import PARENT
from tests.providers.fakes import FakeTranscript, Parent, resume_request
from tests.providers.fakes import events as fake_events
from tests.providers.test_acp_currency import Logged
from tests.providers.test_acp_provider import alive
from tests.providers.test_acp_provider import reaped as reaped_agents
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually

CHILD = Path(__file__).with_name("acp_recovery_child.py")
SDK_AGENT = Path(__file__).with_name("sdk_session_agent.py")

pytestmark = pytest.mark.timeout(120)
slow = pytest.mark.slow  # each test with processes: measured 5-15 s under load (--durations)

reaped = pytest.fixture(reaping, name="reaped")


class Agents(Logged):
    """`Logged` agents that hang in their prompt while ``hold`` exists; ``sdk`` runs the
    SDK-built agent rather than the protocol-written one."""

    def __init__(self, state: Path, hold: Path, *, sdk: bool = False) -> None:
        super().__init__(state)
        self.hold = hold
        self.sdk = sdk

    def held(self, *flags: str) -> list[str]:
        """The command of an agent that hangs in its prompt while ``hold`` exists."""
        if self.sdk:
            return [sys.executable, str(SDK_AGENT), "--state", str(self.state),
                    "--hold", str(self.hold), *flags]  # fmt: skip
        hang = ("--hang-on", "session/prompt", "--hang-if-exists", str(self.hold))
        return self.command(*flags, *hang)

    def prompted(self) -> int:
        path = self.state / "prompts.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    yield from reaped_agents(Agents(tmp_path / "agent-state", tmp_path / "hold"))


@pytest.fixture
def sdk_agents(tmp_path: Path) -> Iterator[Agents]:
    yield from reaped_agents(Agents(tmp_path / "agent-state", tmp_path / "hold", sdk=True))


def _killed_mid_prompt(reaped: Reaper, url: str, mode: str, agents: Agents,
                       flags: tuple[str, ...], prompts: int) -> dict[str, str]:  # fmt: skip
    """Run ``mode`` in a runtime of its own, SIGKILL it once the agent has its
    ``prompts``-th prompt (and, ``steered``, a steer was answered ``steered``), let the next
    agent answer; the runtime's READY facts."""
    command = agents.held(*flags)
    runtime = reaped.add(LinesProcess(CHILD, url, mode, str(agents.hold), *command, name=mode))
    ready: dict[str, str] = json.loads(runtime.expect("READY ").removeprefix("READY "))
    eventually(lambda: agents.prompted() == prompts, "the prompt reached the agent")
    if mode == "steered":
        runtime.say("steer")
        assert runtime.expect("STEERED ") == "steered"
    runtime.proc.send_signal(signal.SIGKILL)
    runtime.reap()
    agents.hold.unlink()
    return ready


def _recovering(control: SubagentControl, agents: Agents, flags: tuple[str, ...]) -> None:
    control.providers.register(AcpProvider(agents.held(*flags), grace_s=0.5, start_timeout_s=10))


def _turn(events: list[SessionEvent], task_id: str) -> list[SessionEvent]:
    """The events of the turn ``task_id`` opened."""
    (start,) = [
        e for e in events
        if e.kind == EventKind.TURN_START and e.data.get("task_id") == task_id
    ]  # fmt: skip
    return [e for e in events if e.turn == start.turn]


def _texts(events: list[SessionEvent], kind: str) -> list[str]:
    return [e.data["text"] for e in events if e.kind == kind]


def _reopens(agents: Agents, method: str) -> None:
    """The last agent process reopened the session with ``method`` and was prompted in it."""
    assert agents.called()[-3:] == ["initialize", method, "session/prompt"], agents.called()


@slow
@pytest.mark.parametrize(
    ("flag", "method"),
    [("--load-session", "session/load"), ("--resume-session", "session/resume")],
)
def test_a_sigkilled_runtimes_acp_turn_goes_on_elsewhere_as_the_same_task(
    reaped: Reaper, agents: Agents, store_url: str, flag: str, method: str
) -> None:
    # Turn 1 ("first") completed; turn 2's prompt ("second") hangs when the runtime dies.
    ready = _killed_mid_prompt(reaped, store_url, "resumed", agents, (flag,), prompts=2)
    task_id, child_id = ready["task_id"], ready["child_id"]

    with SubagentControl.open(store_url, lease_ttl_s=30.0) as control:
        _recovering(control, agents, (flag,))
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(task_id, timeout=3 * WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(child_id).events

    assert done.id == task_id
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "echo: second (remembered: first)"
    assert done.recoveries == 1
    turn = _turn(events, task_id)
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert kinds.count(EventKind.TASK_RECOVERED) == 1, kinds
    assert turn[-1].kind == EventKind.TURN_END
    assert turn[-1].data["status"] == "completed"
    assert _texts(turn, EventKind.USER_MESSAGE) == ["second"]  # sent again, recorded once
    # The load's replay of turn 1 is not recorded again: each reply is in the transcript once.
    assert _texts(events, EventKind.ASSISTANT_MESSAGE) == [
        "echo: first",
        "echo: second (remembered: first)",
    ]
    _reopens(agents, method)
    first, second, again = agents.prompts()
    assert [p["texts"] for p in (first, second, again)] == [["first"], ["second"], ["second"]]
    assert first["session"] == second["session"] == again["session"]


@slow
@pytest.mark.parametrize("flags", [(), ("--load-session",)], ids=["neither", "load"])
def test_the_sdks_agent_side_reopens_a_dead_runtimes_session_or_the_task_ends_saying_why(
    reaped: Reaper, sdk_agents: Agents, sqlite_url: str, flags: tuple[str, ...]
) -> None:
    # The agent is built on the SDK's `Agent` (its replay goes through the SDK's
    # connection); without --load-session it advertises no way to reopen a session.
    ready = _killed_mid_prompt(reaped, sqlite_url, "resumed", sdk_agents, flags, prompts=2)
    with SubagentControl.open(sqlite_url, lease_ttl_s=30.0) as control:
        _recovering(control, sdk_agents, flags)
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(ready["task_id"], timeout=3 * WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(ready["child_id"]).events
    turn = _turn(events, ready["task_id"])
    assert _texts(turn, EventKind.USER_MESSAGE) == ["second"]
    if not flags:
        assert done.status is TaskStatus.INTERRUPTED, done.outcome
        assert done.outcome is not None
        assert "offers neither session/resume nor session/load" in (done.outcome.detail or "")
        assert sdk_agents.prompted() == 2  # no agent was started to carry it on
        return
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "echo: second (remembered: first)"
    assert _texts(events, EventKind.ASSISTANT_MESSAGE) == [
        "echo: first",
        "echo: second (remembered: first)",
    ]


@slow
def test_a_carried_on_turn_gets_the_steer_it_took_again_and_records_it_once(
    reaped: Reaper, agents: Agents, sqlite_url: str
) -> None:
    agents.hold.touch()
    flags = ("--load-session", "--steering")
    ready = _killed_mid_prompt(reaped, sqlite_url, "steered", agents, flags, prompts=1)
    with SubagentControl.open(sqlite_url, lease_ttl_s=30.0) as control:
        _recovering(control, agents, flags)
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(ready["task_id"], timeout=3 * WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(ready["child_id"]).events

    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.recoveries == 1
    turn = _turn(events, ready["task_id"])
    assert _texts(turn, EventKind.USER_MESSAGE) == ["work"]
    assert _texts(turn, EventKind.STEERING_MESSAGE) == ["also this"]
    # The new agent is prompted with the turn's messages in order: the prompt, the steer.
    assert agents.prompts()[-1]["texts"] == ["work", "also this"]
    _reopens(agents, "session/load")


@slow
def test_an_agent_that_offers_neither_method_ends_the_task_interrupted_saying_why(
    reaped: Reaper, agents: Agents, store_url: str
) -> None:
    agents.hold.touch()
    ready = _killed_mid_prompt(reaped, store_url, "start", agents, (), prompts=1)
    eventually(lambda: not [p for p in agents.pids() if alive(p)], "the dead runtime's agent ended")
    with SubagentControl.open(store_url, lease_ttl_s=30.0) as control:
        _recovering(control, agents, ())
        parent = control.agents.register(PARENT)
        done = control.tasks.wait(ready["task_id"], timeout=3 * WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(ready["child_id"]).events
        # A message continues the child in a new turn (a new session, primed).
        again = control.send_message(parent, ready["child_id"], [TextBlock(text="go on")])
        resumed = control.tasks.wait(again.task_id, timeout=3 * WAIT_S, requester=parent)

    assert done.status is TaskStatus.INTERRUPTED, done.outcome
    assert done.outcome is not None
    assert "offers neither session/resume nor session/load" in (done.outcome.detail or "")
    assert done.recoveries == 0
    turn = _turn(events, ready["task_id"])
    assert EventKind.TASK_RECOVERED not in [e.kind for e in turn]
    assert turn[-1].kind == EventKind.TURN_END
    assert turn[-1].data["status"] == "interrupted"
    assert len(agents.pids()) == 2  # the dead runtime's, then the follow-up's: none between
    assert resumed.status is TaskStatus.COMPLETED, resumed.outcome


@slow
@pytest.mark.parametrize("flags", [("--load-session",), ()], ids=["load", "neither"])
def test_close_hands_a_running_acp_turn_over_when_its_agent_can_reopen_the_session(
    reaped: Reaper, agents: Agents, store_url: str, flags: tuple[str, ...]
) -> None:
    agents.hold.touch()
    # A short lease: its sweep (a fraction of the lease) finds the closed runtime's Task soon.
    with SubagentControl.open(store_url, lease_ttl_s=3.0) as control:
        _recovering(control, agents, flags)
        parent = control.agents.register(PARENT)
        command = agents.held(*flags)
        closing = reaped.add(
            LinesProcess(CHILD, store_url, "close", str(agents.hold), *command, name="closing")
        )
        ready = json.loads(closing.expect("READY ").removeprefix("READY "))
        eventually(lambda: agents.prompted() == 1, "the prompt reached the agent")
        agents.hold.unlink()  # the next agent answers; this one waits for its cancel
        closing.say("close")
        assert float(closing.expect("CLOSED ")) < 5.0
        done = control.tasks.wait(ready["task_id"], timeout=3 * WAIT_S, requester=parent)
        assert control.store is not None
        events = control.store.load(ready["child_id"]).events

    turn = _turn(events, ready["task_id"])
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_START) == 1, kinds
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert _texts(turn, EventKind.USER_MESSAGE) == ["work"]
    if not flags:  # it cannot go on elsewhere: killed, as a close did before handover
        assert done.status is TaskStatus.KILLED, done.outcome
        assert EventKind.TASK_RECOVERED not in kinds
        return
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "echo: work"
    assert done.recoveries == 1
    assert kinds.count(EventKind.TASK_RECOVERED) == 1, kinds
    _reopens(agents, "session/load")


# -- what a carried-on turn sends, and when it cannot go on (no processes) ---------------


def _session(reopen: object = "missing") -> tuple[str, dict[str, object]]:
    data: dict[str, object] = {"session_id": "s-1"}
    if reopen != "missing":
        data["reopen"] = reopen
    return (SESSION_EVENT, data)


def test_a_carried_on_turn_sends_its_prompt_and_the_steers_it_took_once_each() -> None:
    open_turn = fake_events(
        (EventKind.TURN_START, {"task_id": "t-1"}),
        (EventKind.USER_MESSAGE, {"text": "do it"}),
        _session("session/load"),
        (EventKind.ASSISTANT_MESSAGE, {"text": "half done"}),
        (EventKind.STEERING_MESSAGE, {"text": "and this"}),
        (EventKind.TASK_RECOVERED, {"task_id": "t-1"}),
    )
    request = resume_request(Parent(), FakeTranscript(), child_id="c-1", events=[], prompt="")
    carried = request.model_copy(update={"open_turn": open_turn, "prompt": []})
    assert open_prompt(carried) == ["do it", "and this"]
    # A message sent with the continuation comes after them; a plain resume sends its own.
    steered = carried.model_copy(update={"prompt": [TextBlock(text="one more")]})
    assert open_prompt(steered) == ["do it", "and this", "one more"]
    assert open_prompt(request.model_copy(update={"prompt": [TextBlock(text="hi")]})) == ["hi"]


@pytest.mark.parametrize(
    ("recorded", "refusal"),
    [
        ([_session("session/resume")], None),
        ([_session("session/load")], None),
        ([_session(None)], "offers neither session/resume nor session/load"),
        ([_session()], "recorded without what reopens it"),
        ([], "never had its session recorded"),
        ([_session("session/load"), _session(None)], "offers neither"),  # the newest counts
    ],
)
def test_whether_a_turn_can_go_on_is_read_from_the_newest_session_record(
    recorded: list[tuple[str, dict[str, object]]], refusal: str | None
) -> None:
    provider = AcpProvider(["agent", "--acp"])
    stored = fake_events((EventKind.USER_MESSAGE, {"text": "x"}), *recorded)
    said = provider.recovery_refusal(stored)
    if refusal is None:
        assert said is None
    else:
        assert said is not None
        assert refusal in said
        assert "'agent --acp'" in said


def test_close_hands_over_until_the_provider_sees_an_agent_that_cannot_reopen_a_session() -> None:
    provider = AcpProvider(["agent"])
    assert provider.recovers_turns  # not known yet: a recovering runtime reads the record
    provider._saw(Capabilities(load=True))
    assert provider.recovers_turns
    provider._saw(Capabilities())
    assert not provider.recovers_turns
