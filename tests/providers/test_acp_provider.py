"""`AcpProvider` behind the real control plane, driving a real ACP agent subprocess.

The agent (`acp_agent.py`) is written from the protocol, not from the client library. Every
agent process (and grandchild) a test starts writes its pid; the fixture checks at teardown,
pass or fail, that none is left alive, and kills any that is.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.providers._acp import THREAD_PREFIX

pytest.importorskip("acp", reason="the acp extra is not installed")
from controlplane import AcpProvider
from tests.support import eventually

from .fakes import ONE_TOOL_CALL

AGENT = Path(__file__).with_name("acp_agent.py")
HARNESS = Path(__file__).with_name("acp_harness.py")
SDK_AGENT = Path(__file__).with_name("sdk_example_agent.py")
WAIT_S = 15.0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


A = TypeVar("A", bound="Agents")


class Agents:
    """Builds agent command lines sharing one state directory, and checks their pids."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def command(self, *flags: str) -> list[str]:
        return [sys.executable, str(AGENT), "--state", str(self.state), *flags]

    def pids(self) -> list[int]:
        path = self.state / "pids"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    def prompts(self) -> list[dict[str, Any]]:
        path = self.state / "prompts.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


def reaped(made: A) -> Iterator[A]:
    """An agents fixture's body: yield ``made``, then fail on (and kill) any agent process
    that outlived its activation."""
    yield made
    survivors = [pid for pid in made.pids() if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], "an agent process outlived its activation"


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    yield from reaped(Agents(tmp_path / "agent-state"))


@pytest.fixture
def control(sqlite_url: str) -> Iterator[SubagentControl]:
    with SubagentControl.open(sqlite_url) as opened:
        yield opened
    assert not [t for t in _threads() if t.startswith(THREAD_PREFIX)]


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


def register(control: SubagentControl, agents: Agents, *flags: str, **options: Any) -> None:
    options.setdefault("start_timeout_s", 10.0)
    options.setdefault("grace_s", 1.0)
    control.providers.register(AcpProvider(agents.command(*flags), **options))


def start(control: SubagentControl, parent: AgentHandle, prompt: str) -> tuple[str, str]:
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="acp", label="acp child", prompt=[TextBlock(text=prompt)], parent=parent
        )
    )
    return started.child_id, started.task_id


def settle(control: SubagentControl, task_id: str, parent: AgentHandle) -> TaskSnapshot:
    snapshot = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert snapshot.status.is_terminal
    return snapshot


def events(control: SubagentControl, child_id: str) -> list[SessionEvent]:
    assert control.store is not None
    return control.store.load(child_id).events


def assert_no_child(control: SubagentControl, child_id: str) -> None:
    """A start that failed before publication leaves no durable child (SPEC §5.4)."""
    assert control.store is not None
    with pytest.raises(SubagentControlError) as caught:
        control.store.load(child_id)
    assert caught.value.code is ErrorCode.CHILD_NOT_FOUND


def test_a_started_child_answers_and_its_messages_and_tool_calls_are_recorded(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--tool-call")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "summarise the notes")

    snapshot = settle(control, task_id, parent)

    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "echo: summarise the notes"
    stored = events(control, child_id)
    assert [e.kind for e in stored] == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.DESCRIPTOR,
        "acp/session",
        "tool/call",
        "tool/result",
        EventKind.ASSISTANT_MESSAGE,
        EventKind.TURN_END,
    ]
    assert stored[4].data == {
        "id": "tool-1",
        "name": "read notes",
        "arguments": {"path": "notes.md"},
    }
    assert stored[5].data == {"id": "tool-1", "output": "3 notes", **ONE_TOOL_CALL}
    assert stored[6].data == {"text": "echo: summarise the notes", "usage_reported": False}


def test_the_usage_an_acp_agent_reports_is_recorded_with_the_turns_last_message(
    control: SubagentControl, agents: Agents
) -> None:
    reported = {
        "totalTokens": 75,
        "inputTokens": 50,
        "outputTokens": 25,
        "thoughtTokens": 5,
        "cachedReadTokens": 40,
    }
    register(control, agents, "--tool-call", "--usage", json.dumps(reported))
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "count")
    settle(control, task_id, parent)

    turn = Usage(input_tokens=50, output_tokens=25, reasoning_tokens=5, cached_input_tokens=40)
    (reply,) = [e for e in events(control, child_id) if e.kind == EventKind.ASSISTANT_MESSAGE]
    assert reply.data == {"text": "echo: count", "usage": turn.stored()}
    # The agent's model calls are not visible through ACP: none counted, none invented.
    assert control.usage(parent, child_id) == turn + Usage(tool_calls=1)


def test_an_acp_turn_that_reports_no_usage_says_so_and_counts_only_its_tool_calls(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--tool-call")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "count")
    settle(control, task_id, parent)

    (reply,) = [e for e in events(control, child_id) if e.kind == EventKind.ASSISTANT_MESSAGE]
    assert reply.data == {"text": "echo: count", "usage_reported": False}
    assert control.usage(parent, child_id) == Usage(tool_calls=1)


def test_a_turn_that_ended_with_no_message_records_its_usage_in_an_event_of_its_own() -> None:
    from acp.schema import Usage as AcpUsage

    from controlplane.providers._acp_client import USAGE_EVENT, AcpRecorder

    from .fakes import FakeTranscript, Written

    for reported, data in [
        (None, {"usage_reported": False}),
        (
            AcpUsage(total_tokens=4, input_tokens=3, output_tokens=1),
            {"usage": {"input_tokens": 3, "output_tokens": 1}},
        ),
    ]:
        transcript = FakeTranscript()
        AcpRecorder(transcript, "deny").end_turn(reported)
        assert transcript.written == [Written(USAGE_EVENT, data, None)]


def test_a_resume_loads_the_agents_session_when_it_can_and_records_no_replay(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--load-session")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "remember otters")
    settle(control, task_id, parent)

    again = control.send_message(parent, child_id, [TextBlock(text="what did I say?")])
    assert again.route == "started"
    snapshot = settle(control, again.task_id, parent)

    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "echo: what did I say? (remembered: remember otters)"
    first, second = agents.prompts()
    assert second["session"] == first["session"]
    assert second["texts"] == ["what did I say?"]
    turn_two = [(e.kind, e.data) for e in events(control, child_id) if e.turn == 2]
    assert [kind for kind, _ in turn_two] == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,  # the new answer only: the load's replay is not recorded
        EventKind.TURN_END,
    ]


def test_without_load_session_a_resume_opens_a_new_session_primed_with_the_transcript(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents)
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "remember otters")
    settle(control, task_id, parent)

    again = control.send_message(parent, child_id, [TextBlock(text="and now?")])
    snapshot = settle(control, again.task_id, parent)

    assert snapshot.outcome is not None
    assert snapshot.outcome.output == "echo: and now? (context blocks: 1)"
    first, second = agents.prompts()
    assert second["session"] != first["session"]
    context, prompt = second["texts"]
    assert "User: remember otters" in context
    assert "You: echo: remember otters" in context
    assert prompt == "and now?"
    sessions = [e.data for e in events(control, child_id) if e.kind == "acp/session"]
    assert sessions == [
        {"session_id": first["session"], "reopen": None},
        {"session_id": second["session"], "reopen": None},
    ]


def test_a_follow_up_during_a_running_turn_is_not_delivered_and_a_kill_ends_it(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--hang-on", "session/prompt")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "think forever")

    with pytest.raises(SubagentControlError) as caught:
        control.send_message(parent, child_id, [TextBlock(text="are you there?")])
    assert caught.value.code is ErrorCode.NOT_DELIVERED

    control.tasks.kill(task_id, requester=parent)
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.KILLED
    assert not [pid for pid in agents.pids() if alive(pid)]


def test_an_agent_that_ignores_cancel_and_sigterm_is_killed_and_reaped(
    control: SubagentControl, agents: Agents
) -> None:
    register(
        control, agents, "--hang-on", "session/prompt", "--ignore-cancel", "--ignore-sigterm",
        grace_s=0.3,
    )  # fmt: skip
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "never stop")
    control.tasks.kill(task_id, requester=parent)
    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    assert not [pid for pid in agents.pids() if alive(pid)]


def test_the_agents_own_processes_do_not_outlive_the_activation(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--grandchild")
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    pids = agents.pids()
    assert len(pids) == 2
    # The agent is reaped before its Task settles; its grandchild, left behind, was sent
    # SIGKILL, which the kernel completes on its own time (under load, not always at once).
    eventually(lambda: not [pid for pid in pids if alive(pid)], "the agent's processes ended")


@pytest.mark.parametrize(
    ("flags", "start_timeout_s", "detail"),
    [
        # The crash must come before the start bound, however slowly the agent's
        # interpreter starts under load: the default bound. Only the hang needs a short one.
        (("--crash-on", "initialize"), 10.0, "exited with code 3 while starting"),
        (("--hang-on", "initialize"), 0.5, "did not answer initialize"),
    ],
)
def test_an_agent_that_crashes_or_hangs_while_starting_fails_the_task_and_leaves_no_child(
    control: SubagentControl,
    agents: Agents,
    flags: tuple[str, ...],
    start_timeout_s: float,
    detail: str,
) -> None:
    register(control, agents, *flags, start_timeout_s=start_timeout_s)
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "hello")

    snapshot = settle(control, task_id, parent)

    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert detail in (snapshot.outcome.detail or "")
    if "crash" in flags[0]:
        assert "crashing on initialize as asked" in (snapshot.outcome.detail or "")
    assert_no_child(control, child_id)


def test_an_agent_that_crashes_mid_prompt_fails_the_task_naming_its_exit(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--crash-on", "after-reply")
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert "exited with code 4 during its prompt" in (snapshot.outcome.detail or "")


def test_a_command_that_does_not_exist_fails_the_start_saying_so(
    control: SubagentControl, agents: Agents
) -> None:
    control.providers.register(AcpProvider([str(agents.state / "no-such-agent")]))
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "hello")
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert_no_child(control, child_id)
    assert snapshot.outcome is not None
    assert "no-such-agent" in (snapshot.outcome.detail or "")


@pytest.mark.parametrize(("policy", "option"), [("deny", "no"), ("allow", "yes")])
def test_permission_requests_are_answered_by_the_policy(
    control: SubagentControl, agents: Agents, policy: str, option: str
) -> None:
    register(control, agents, "--ask-permission", permission=policy)
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "clean up")
    snapshot = settle(control, task_id, parent)
    assert snapshot.outcome is not None
    assert f'"optionId": "{option}"' in (snapshot.outcome.output or "")


@pytest.mark.parametrize(("allow", "option"), [(True, "yes"), (False, "no")])
def test_an_ask_policy_turns_a_permission_request_into_an_approval_the_parent_answers(
    control: SubagentControl, agents: Agents, allow: bool, option: str
) -> None:
    register(control, agents, "--ask-permission", permission="ask")
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "clean up")
    waiting = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert waiting.status is TaskStatus.INPUT_REQUIRED
    assert waiting.request is not None
    assert waiting.request.tool == "delete everything"
    (notice,) = control.tasks.drain_notices(parent)
    assert waiting.request.id in notice.summary

    control.answer(parent, waiting.request.id, allow=allow, note="checked")
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.COMPLETED
    assert snapshot.outcome is not None
    assert f'"optionId": "{option}"' in (snapshot.outcome.output or "")
    assert control.store is not None
    kinds = [e.kind for e in control.store.load(child_id).events]
    assert kinds.count(EventKind.APPROVAL_REQUEST) == 1
    assert kinds.count(EventKind.APPROVAL_ANSWER) == 1


def test_a_killed_ask_is_cancelled_at_the_agent_and_the_task_killed(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--ask-permission", permission="ask")
    parent = control.agents.register("parent-1")
    _child, task_id = start(control, parent, "clean up")
    waiting = control.tasks.wait(task_id, timeout=WAIT_S, requester=parent)
    assert waiting.request is not None
    control.tasks.kill(task_id, requester=parent)
    assert settle(control, task_id, parent).status is TaskStatus.KILLED


def test_an_unknown_permission_policy_is_refused(agents: Agents) -> None:
    with pytest.raises(SubagentControlError) as refused:
        AcpProvider(agents.command(), permission="maybe")  # type: ignore[arg-type]
    assert refused.value.code is ErrorCode.INVALID_INPUT


def test_an_agents_stop_reason_becomes_the_tasks_outcome(
    control: SubagentControl, agents: Agents
) -> None:
    register(control, agents, "--stop-reason", "max_tokens")
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")
    snapshot = settle(control, task_id, parent)
    assert snapshot.status is TaskStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.detail == "max-tokens"


def test_without_the_extra_the_provider_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['acp'] = None\n"
        "from controlplane import AcpProvider\n"
        "try:\n    AcpProvider(['agent'])\nexcept ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'subagent-control[acp]'" in out.stdout


def test_a_kill_while_the_agent_is_starting_rolls_back_and_leaves_no_child(
    control: SubagentControl, agents: Agents
) -> None:
    fifo = agents.state.parent / "announce"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        register(
            control, agents, "--hang-on", "initialize", "--announce", str(fifo),
            start_timeout_s=60.0,
        )  # fmt: skip
        parent = control.agents.register("parent-1")
        child_id, task_id = start(control, parent, "hello")
        ready, _, _ = select.select([reader], [], [], WAIT_S)
        assert ready, "the agent never got stuck in initialize"
        assert os.read(reader, 100) == b"hanging in initialize\n"
    finally:
        os.close(reader)

    control.tasks.kill(task_id, requester=parent)

    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    assert_no_child(control, child_id)
    assert not [pid for pid in agents.pids() if alive(pid)]


def test_a_start_whose_activation_was_already_cancelled_spawns_nothing(agents: Agents) -> None:
    from controlplane import (
        CancelSignal,
        Descriptor,
        MessageSource,
        StartRequest,
    )
    from controlplane.contract import AgentRegistry

    from .fakes import FakeTranscript

    signal = CancelSignal()
    signal.abort("killed before it began")
    request = StartRequest(
        child_id="c-1",
        prompt=[TextBlock(text="hello")],
        source=MessageSource(kind="user"),
        parent=AgentRegistry().register("parent-1"),
        descriptor=Descriptor.build(provider="acp"),
        depth=1,
        transcript=FakeTranscript(),
    )
    with pytest.raises(SubagentControlError) as caught:
        AcpProvider(agents.command()).start(request, signal)
    assert caught.value.code is ErrorCode.CANCELLED
    assert agents.pids() == []


def test_a_kill_mid_prompt_reaps_an_agent_that_ignores_eof_and_sigterm_and_its_wrapper(
    control: SubagentControl, agents: Agents
) -> None:
    # The agent answers session/cancel at once, then neither exits on EOF nor on SIGTERM:
    # only SIGKILL ends it, and a cancellation landing while it is reaped must not skip it.
    flags = ("--wrapper", "--hang-on", "session/prompt", "--ignore-eof", "--ignore-sigterm")
    register(control, agents, *flags, grace_s=0.5)
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "never stop")
    eventually(lambda: agents.state.joinpath("prompts.jsonl").exists(), "the prompt arrived")

    control.tasks.kill(task_id, requester=parent)

    assert settle(control, task_id, parent).status is TaskStatus.KILLED
    pids = agents.pids()
    assert len(pids) == 2  # the wrapper and the agent it runs
    eventually(lambda: not [pid for pid in pids if alive(pid)], "the agent's processes ended")


def test_close_mid_prompt_reaps_an_agent_that_ignores_eof_and_sigterm_and_its_wrapper(
    sqlite_url: str, agents: Agents
) -> None:
    flags = ("--wrapper", "--hang-on", "session/prompt", "--ignore-eof", "--ignore-sigterm")
    with SubagentControl.open(sqlite_url) as control:
        register(control, agents, *flags, grace_s=0.5)
        parent = control.agents.register("parent-1")
        start(control, parent, "never stop")
        eventually(lambda: agents.state.joinpath("prompts.jsonl").exists(), "the prompt arrived")
        pids = agents.pids()
    # close() returned: the wrapper was reaped, the agent under it sent SIGKILL.
    eventually(lambda: not [pid for pid in pids if alive(pid)], "the agent's processes ended")
    assert not [t for t in _threads() if t.startswith(THREAD_PREFIX)]


def test_a_finished_turn_of_an_agent_that_ignores_eof_settles_without_waiting_out_the_grace(
    control: SubagentControl, agents: Agents
) -> None:
    # A grace period longer than the wait: the Task settles only if the agent, done with its
    # turn, is asked to exit (SIGTERM) rather than waited for.
    register(control, agents, "--ignore-eof", grace_s=2 * WAIT_S)
    parent = control.agents.register("parent-1")
    _, task_id = start(control, parent, "hello")
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    assert not [pid for pid in agents.pids() if alive(pid)]


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(("--hang-on", "session/prompt"), id="mid-prompt"),
        pytest.param(("--hang-on", "initialize"), id="while-starting"),
    ],
)
@pytest.mark.slow  # measured: 20 s under load (--durations)
def test_a_sigkilled_harness_leaves_no_agent_process_behind(
    sqlite_url: str, agents: Agents, flags: tuple[str, ...]
) -> None:
    # The agent runs under a wrapper, ignores EOF and left a grandchild in its group.
    flags = ("--wrapper", "--grandchild", "--ignore-eof", *flags)
    harness = subprocess.Popen(
        [sys.executable, str(HARNESS), sqlite_url, *agents.command(*flags)],
        stdin=subprocess.PIPE,  # it waits on this until killed
        cwd=Path(__file__).parents[2],
    )
    try:
        # The wrapper, the agent and the agent's grandchild.
        eventually(lambda: len(agents.pids()) == 3, "the agent and its grandchild started")
        if "session/prompt" in flags:
            eventually(lambda: agents.state.joinpath("prompts.jsonl").exists(), "prompted")
        pids = agents.pids()
    finally:
        harness.kill()
        harness.wait(WAIT_S)
        if harness.stdin is not None:
            harness.stdin.close()
    # Its guard gives the agent's group SIGTERM, and SIGKILL after the 0.5 s grace.
    eventually(lambda: not [pid for pid in pids if alive(pid)], "the agent's processes ended")


@pytest.mark.slow  # measured: 7 s under load (--durations)
def test_the_sdks_example_agent_answers_resumes_and_is_reaped_promptly(
    control: SubagentControl, tmp_path: Path
) -> None:
    # A third-party peer: it does not exit when its stdin closes (~0.2 s of asyncio
    # teardown), streams chunks with no message id (one message per turn here), and does
    # not advertise session/load, so a resume opens a new session primed with the transcript.
    command = [sys.executable, str(SDK_AGENT)]
    control.providers.register(AcpProvider(command, start_timeout_s=10.0, grace_s=2 * WAIT_S))
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "hello")
    first = settle(control, task_id, parent)
    again = control.send_message(parent, child_id, [TextBlock(text="and again")])
    second = settle(control, again.task_id, parent)

    assert first.outcome is not None
    assert first.outcome.output == "Client sent:hello"
    assert second.outcome is not None
    assert (second.outcome.output or "").startswith("Client sent:You are continuing")
    assert (second.outcome.output or "").endswith("and again")
    replies = [e.data for e in events(control, child_id) if e.kind == EventKind.ASSISTANT_MESSAGE]
    assert len(replies) == 2
    assert running(SDK_AGENT) == []  # each reaped before its Task settled


def running(script: Path) -> list[int]:
    """The live processes whose command line names ``script`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = entry.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        if str(script).encode() in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_a_kill_while_the_agent_starts_a_resume_keeps_the_message_in_a_turn_closed_killed(
    control: SubagentControl, agents: Agents
) -> None:
    hang = agents.state.parent / "hang"  # the agent hangs in initialize once this exists
    fifo = agents.state.parent / "announce"
    os.mkfifo(fifo)
    flags = ("--hang-on", "initialize", "--hang-if-exists", str(hang), "--announce", str(fifo))
    register(control, agents, *flags, start_timeout_s=60.0)
    parent = control.agents.register("parent-1")
    child_id, task_id = start(control, parent, "hello")
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    hang.touch()
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        again = control.send_message(parent, child_id, [TextBlock(text="carry on")])
        assert again.route == "started"
        ready, _, _ = select.select([reader], [], [], WAIT_S)
        assert ready, "the agent never got stuck in initialize"
        assert os.read(reader, 100) == b"hanging in initialize\n"
    finally:
        os.close(reader)

    control.tasks.kill(again.task_id, requester=parent)

    assert settle(control, again.task_id, parent).status is TaskStatus.KILLED
    turn_2 = [e for e in events(control, child_id) if e.turn == 2]
    assert [e.kind for e in turn_2] == [
        EventKind.TURN_START,
        EventKind.USER_MESSAGE,
        EventKind.TURN_END,
    ]
    assert turn_2[1].data == {"text": "carry on"}
    assert turn_2[2].data == {"task_id": again.task_id, "status": "killed"}
    assert not [pid for pid in agents.pids() if alive(pid)]
