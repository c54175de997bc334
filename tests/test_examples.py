"""The examples run end to end, exactly as the README tells a newcomer to run them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


@pytest.mark.timeout(150)
def test_quickstart_steers_restarts_resumes_and_kills(tmp_path: Path) -> None:
    out = run_example("quickstart.py", "--db", f"sqlite:///{tmp_path}/state.db")

    assert "route=steered" in out
    # The steered message joined the first turn: the answer saw two requests.
    assert "2 request(s) so far: find three facts about otters | focus on sea otters" in out
    # After the restart the resumed child still remembers both earlier requests.
    assert "route=started" in out
    assert "3 request(s) so far: find three facts about otters | focus on sea otters" in out
    assert "killed    killed by parent-1" in out
    # The tree was printed while activations were live.
    assert "activation" in out
    assert "(initial, published, running" in out  # research: published before the steer returned
    assert "steering/message     from coordinator" in out


@pytest.mark.timeout(150)
def test_human_and_parent_messages_share_one_turn_with_their_sources() -> None:
    out = run_example("human_and_parent.py")

    assert "steered into task" in out
    assert "message delivered to running task" in out
    assert "[status: completed]" in out
    transcript = out.split("the child's transcript")[1]
    assert "steering/message   human/alice" in transcript
    assert "steering/message   coordinator/parent-1" in transcript
    assert transcript.count("turn 1") == 3


@pytest.mark.timeout(150)
@pytest.mark.slow  # measured: 5 s under load (--durations)
def test_openai_child_calls_its_tool_and_is_resumed_against_a_local_server() -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    from tests.providers.openai_server import ChatServer

    count = {"id": "call_1", "name": "word_count", "arguments": {"text": "the quick brown fox"}}
    with ChatServer([{"tool_calls": [count]}, {"text": "4 words"}, {"text": "8"}]) as server:
        out = run_example("openai_child.py", "--base-url", server.base_url, "--model", "m")
        requests = server.requests

    assert "turn -> completed: 4 words" in out
    assert "turn -> completed: 8" in out
    assert "tool/result" in out
    # The resumed turn sent the whole conversation, the tool exchange included.
    assert [m["role"] for m in requests[2]["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "user",
    ]  # fmt: skip


def test_openai_child_without_a_server_says_how_to_start_one() -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    from tests.providers.openai_server import ChatServer

    with ChatServer() as gone:
        url = gone.base_url
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_child.py"), "--base-url", url,
         "--model", "m"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert "No model server answers" in result.stderr
    assert "ollama serve" in result.stderr


@pytest.mark.timeout(150)
def test_acp_child_runs_an_agent_and_continues_it(tmp_path: Path) -> None:
    pytest.importorskip("acp", reason="the acp extra is not installed")
    agent = ROOT / "tests" / "providers" / "acp_agent.py"
    out = run_example(
        "acp_child.py", "--prompt", "remember otter", "--follow-up", "which word?",
        "--", sys.executable, str(agent), "--state", str(tmp_path), "--load-session",
    )  # fmt: skip

    assert "turn 1 ('remember otter') -> completed: echo: remember otter" in out
    assert "(remembered: remember otter)" in out
    assert "acp/session" in out


def test_quickstart_piped_to_a_reader_that_goes_early_exits(tmp_path: Path) -> None:
    # `python examples/quickstart.py | head -3`: the demo dies of a BrokenPipeError with
    # both children mid-turn and no close(); it must still exit (issue 24).
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--db",
         f"sqlite:///{tmp_path}/state.db"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        text=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        for _ in range(3):
            demo.stdout.readline()
        demo.stdout.close()
        demo.wait(30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
    assert demo.returncode is not None


@pytest.mark.timeout(150)
@pytest.mark.slow  # measured: 7 s under load (--durations)
def test_mcp_front_drives_a_child_through_the_stdio_server(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    out = run_example("mcp_front.py", "--db", f"sqlite:///{tmp_path}/state.db")

    assert "tools: subagent, send_message, task_output" in out
    assert "subagent      -> echo: find three otter facts\n[status: completed]" in out
    assert "send_message  -> MCP task " in out
    assert "tasks/result  -> echo: now only sea otters\n[status: completed]" in out
    assert "2 model calls" in out  # the follow-up continued the same child


@pytest.mark.timeout(150)
def test_observe_draws_one_turn_s_trace_with_the_model_and_tool_spans_under_the_activation() -> (
    None
):
    pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed")
    out = run_example("observe.py")

    assert "exporting spans to the console" in out
    assert "steer from another thread: route=steered" in out
    assert "task killed" in out
    tree = out.split("one turn's trace")[1]
    assert "    subagent.activation  (error.type=CANCELLED, steered by subagent.send)" in tree
    assert "      chat scripted-1\n" in tree
    assert "      execute_tool lookup\n        lookup (the tool's own span)" in tree
    assert "      chat scripted-1  (error.type=CANCELLED)" in tree
    assert "  subagent.kill" in tree


@pytest.mark.timeout(150)
def test_a_console_without_providers_steers_and_answers_and_a_closed_worker_hands_over(
    tmp_path: Path,
) -> None:
    out = run_example("worker_and_console.py", "--db", f"sqlite:///{tmp_path}/state.db")

    assert "console: steered into task" in out
    assert "completed: 'deployed, and checked the logs'" in out
    assert "deploy ran 1 time(s)" in out
    assert "queued for a runtime with provider 'inprocess'" in out
    assert "console: steered into the same task: True" in out
    assert re.search(r"worker:  ran that task \w+: completed", out), out
    # The worker that took the waiting turn read both of the console's messages, once.
    assert "the last: ['and note it in the changelog', 'and tell the team']" in out
    assert "the turn is handed over" in out
    assert "completed (recovered 1 time)" in out
