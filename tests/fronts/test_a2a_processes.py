"""The A2A front as the real command, ``python -m controlplane.cli a2a``, driven by the SDK's
client: one server start to end and after a restart, two servers on one PostgreSQL store
(a Task started on one is steered and followed on the other), a bind beyond loopback with
its generated token, and the missing extra.

Every server is reaped when its test ends, pass or fail (``reaped``)."""

from __future__ import annotations

import signal
import stat
from pathlib import Path

import httpx
import pytest

from controlplane.contract import EventKind
from controlplane.fronts import TOKEN_ENV
from persistence import SqlStore
from tests.fronts.a2a_support import (
    A2AProcess,
    GetTaskRequest,
    TaskState,
    a2a_client,
    first_task,
    message,
    run,
    send,
    stream,
    subscribe,
    texts,
    wait_state,
)
from tests.reliability.processes import Reaper, reaping
from tests.support import WAIT_S, inbound, run_python

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")

GATED = "tests.fronts.a2a_setup:gated"
ECHO = "tests.fronts.a2a_setup:setup"
COMPLETED = TaskState.TASK_STATE_COMPLETED


def test_the_command_starts_steers_and_answers_after_a_restart(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    server = reaped.add(
        A2AProcess(sqlite_url, "--setup", GATED, name="a2a", stderr=tmp_path / "a2a.err")
    )
    url = server.ready()

    async def drive() -> tuple[str, str, str, str]:
        async with a2a_client(url, streaming=False) as client:
            started = await send(client, message("first"))
            steered = await send(
                client, message("second", context_id=started.context_id, task_id=started.id)
            )
            server.say("release")
            server.say("release")
            done = await wait_state(client, started.id, COMPLETED)
            return started.id, started.context_id, steered.id, done.artifacts[0].parts[0].text

    task_id, context, steered_id, output = run(drive)

    assert steered_id == task_id
    assert output == "echo: second"
    with SqlStore(sqlite_url, read_only=True) as store:
        steers = inbound(store.load(context).events, "second")
    assert [e.kind for e in steers] == [EventKind.STEERING_MESSAGE]

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(WAIT_S) == 0
    again = reaped.add(A2AProcess(sqlite_url, "--setup", ECHO, name="a2a-again"))
    again_url = again.ready()

    async def look() -> tuple[int, list[str]]:
        async with a2a_client(again_url) as client:
            task = await client.get_task(GetTaskRequest(id=task_id))
            return task.status.state, [m.parts[0].text for m in task.history]

    state, history = run(look)
    assert state == COMPLETED
    # The steer may join the first model call or the second: the end is the same.
    assert history[0] == "first"
    assert "second" in history
    assert history[-1] == "echo: second"


@pytest.mark.postgres
def test_a_task_started_on_one_server_is_steered_and_followed_on_another(
    reaped: Reaper, pg_url: str, tmp_path: Path
) -> None:
    first = reaped.add(
        A2AProcess(pg_url, "--setup", GATED, name="first", stderr=tmp_path / "first.err")
    )
    second = reaped.add(
        A2AProcess(pg_url, "--setup", ECHO, name="second", stderr=tmp_path / "second.err")
    )
    first_url, second_url = first.ready(), second.ready()

    async def drive() -> tuple[str, str, list]:  # type: ignore[type-arg]
        async with (
            a2a_client(first_url, streaming=False) as on_first,
            a2a_client(second_url) as watching,
            a2a_client(second_url, streaming=False) as on_second,
        ):
            started = await send(on_first, message("watch from afar"))
            following = subscribe(watching, started.id)
            assert (await first_task(following)).id == started.id
            steered = await send(on_second, message("and this", context_id=started.context_id))
            first.say("release")
            first.say("release")
            return started.id, steered.id, await stream(following)

    task_id, steered_id, rest = run(drive, timeout_s=60)

    assert steered_id == task_id  # forwarded to the runtime that runs it: one Task
    assert texts(rest)[-1] == "echo: and this"
    assert rest[-1].status_update.status.state == COMPLETED
    assert rest[-2].artifact_update.artifact.parts[0].text == "echo: and this"


def test_without_the_extra_the_command_says_which_extra_to_install(sqlite_url: str) -> None:
    code = (
        "import sys; sys.modules['a2a'] = None\n"
        "from controlplane.cli import main\n"
        f"sys.exit(main(['a2a', '--db', {sqlite_url!r}, '--http', '127.0.0.1:0']))"
    )
    done = run_python("-c", code, timeout=60.0)

    assert done.returncode == 2, done.stderr  # a usage problem: install the extra
    assert "pip install 'subagent-control[a2a]'" in done.stderr


def test_openai_flags_start_children_on_a_chat_completions_server(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    from tests.providers.openai_server import ChatServer

    with ChatServer([{"text": "three facts about otters"}]) as chat:
        server = reaped.add(
            A2AProcess(
                sqlite_url, "--openai-model", "m", "--openai-base-url", chat.base_url,
                name="a2a-openai", stderr=tmp_path / "a2a.err",
            )
        )  # fmt: skip
        url = server.ready()

        async def ask() -> tuple[int, str]:
            async with a2a_client(url, streaming=False) as client:
                done = await send(client, message("otters?", immediately=False))
                return done.status.state, done.artifacts[0].parts[0].text

        state, output = run(ask)

    assert state == COMPLETED
    assert output == "three facts about otters"


def test_a_non_loopback_bind_without_a_token_generates_one_into_a_0600_file(
    reaped: Reaper, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rule as the MCP front's: a new file in the temporary directory, its path
    printed after the URL; a request without the token changes nothing."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    server = reaped.add(
        A2AProcess(
            sqlite_url, "--setup", ECHO, name="a2a-public", bind="0.0.0.0:0",
            env={"TMPDIR": str(tmp_path)}, stderr=tmp_path / "a2a.err",
        )
    )  # fmt: skip
    url = server.ready().replace("0.0.0.0", "127.0.0.1")
    token_file = Path(server.expect("bearer token written to "))
    token = token_file.read_text(encoding="utf-8").strip()

    refused = httpx.post(url, json={}, timeout=WAIT_S)

    async def ask() -> str:
        async with a2a_client(url, streaming=False, token=token) as client:
            done = await send(client, message("hello", immediately=False))
            return done.artifacts[0].parts[0].text

    assert token_file.parent == tmp_path
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert refused.status_code == 401
    assert run(ask) == "echo: hello"
    assert "serving beyond this machine" in (tmp_path / "a2a.err").read_text(encoding="utf-8")
