"""``subagent-control console`` as the real command: it prints its address once it listens
and stops on SIGTERM; beyond loopback it asks a token (generated into a 0600 file when none
is given); without its extra it exits 2 naming the extra; with ``--setup`` giving it a provider, a
message from the page resumes an idle child in the console's own process; it says which
providers it serves (or none), and with ``-v`` logs one line per request, never its query."""

from __future__ import annotations

import re
import signal
import stat
from pathlib import Path

import httpx
import pytest

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from persistence import SqlStore
from tests.console.support import ConsoleProcess
from tests.reliability.processes import Reaper
from tests.support import WAIT_S, run_python

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_the_command_serves_the_store_and_stops_on_sigterm(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    console = reaped.add(ConsoleProcess(sqlite_url, stderr=tmp_path / "console.err"))
    url = console.ready()

    page = httpx.get(url, timeout=WAIT_S)
    runtimes = httpx.get(f"{url}api/runtimes", timeout=WAIT_S).json()

    assert page.status_code == 200
    assert "Needs you" in page.text
    assert [r["pid"] for r in runtimes["runtimes"]] == [console.proc.pid]
    said = (tmp_path / "console.err").read_text(encoding="utf-8")
    assert "subagent-control: serving no provider: " in said
    assert "GET /" not in said  # requests are logged with -v only
    console.proc.send_signal(signal.SIGTERM)
    assert console.proc.wait(WAIT_S) == 0


def test_with_demo_and_v_it_says_its_provider_and_logs_each_request_without_its_query(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    err = tmp_path / "console.err"
    console = reaped.add(
        ConsoleProcess(sqlite_url, "--demo", "-v", "--token", "s3cret-token", stderr=err)
    )
    url = console.ready()

    with httpx.Client(base_url=url, timeout=WAIT_S, follow_redirects=True) as client:
        shown = client.get("/api/overview?token=s3cret-token")  # 303 with the cookie, then 200
        missing = client.get("/children/no-such-child")

    assert (shown.status_code, missing.status_code) == (200, 404)
    said = err.read_text(encoding="utf-8")  # each line is written before its response
    assert "subagent-control: serving provider 'demo': " in said
    requests = [line for line in said.splitlines() if line.startswith("controlplane.console: ")]
    assert [line.split()[1:4] for line in requests] == [
        ["GET", "/api/overview", "303"],
        ["GET", "/api/overview", "200"],
        ["GET", "/children/no-such-child", "404"],
    ]
    assert "s3cret-token" not in said


def test_beyond_loopback_the_console_asks_a_generated_token(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    console = reaped.add(
        ConsoleProcess(
            sqlite_url,
            bind="0.0.0.0:0",
            stderr=tmp_path / "console.err",
            env={"TMPDIR": str(tmp_path)},
        )
    )
    url = console.ready().replace("0.0.0.0", "127.0.0.1")
    token_file = Path(console.expect("bearer token written to "))
    token = token_file.read_text(encoding="ascii").strip()

    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert httpx.get(f"{url}api/overview", timeout=WAIT_S).status_code == 401
    shown = httpx.get(
        f"{url}api/overview", timeout=WAIT_S, headers={"authorization": f"Bearer {token}"}
    )
    assert shown.status_code == 200


def test_without_the_extra_the_command_says_which_extra_to_install(sqlite_url: str) -> None:
    code = (
        "import sys; sys.modules['uvicorn'] = None\n"
        "from controlplane.cli import main\n"
        f"sys.exit(main(['console', '--db', {sqlite_url!r}, '--http', '127.0.0.1:0']))"
    )
    done = run_python("-c", code, timeout=60.0)

    assert done.returncode == 2, done.stderr
    assert "pip install 'subagent-control[console]'" in done.stderr


def test_with_setup_a_message_from_the_console_resumes_an_idle_child_there(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    with SubagentControl.open(sqlite_url) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["first turn done"])))
        parent = control.agents.register("harness")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label="idle one",
                parent=parent,
                prompt=[TextBlock(text="go")],
            )
        )
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    console = reaped.add(
        ConsoleProcess(
            sqlite_url,
            "--setup",
            "tests.console.console_setup:echo",
            stderr=tmp_path / "console.err",
        )
    )
    url = console.ready()

    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        page = client.get(f"/children/{started.child_id}")
        csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page.text)
        assert csrf is not None
        sent = client.post(
            f"/api/children/{started.child_id}/messages",
            json={"message": "once more"},
            headers={"origin": url.rstrip("/"), "x-csrf-token": csrf.group(1)},
        )
        assert sent.status_code == 200, sent.text
        assert sent.json()["route"] == "started"
        task_id = sent.json()["task_id"]
    with SubagentControl.open(sqlite_url) as watcher:  # waits on the store's Task row
        done = watcher.tasks.wait(task_id, timeout=WAIT_S, requester="harness")

    assert done.status is TaskStatus.COMPLETED
    assert done.runtime_id == console_runtime(sqlite_url, console.proc.pid)
    with SqlStore(sqlite_url, read_only=True) as store:
        task = store.ledger.get(task_id)
        inbound = [e for e in store.load(started.child_id).events if e.kind == "user/message"]
    assert task is not None
    assert task.outcome is not None
    assert task.outcome.output == "echo: once more"
    assert [(e.data["text"], e.source.kind if e.source else None) for e in inbound][-1] == (
        "once more",
        "human",
    )


def console_runtime(url: str, pid: int) -> str:
    """The runtime id of the process ``pid`` on the store at ``url``."""
    with SqlStore(url, read_only=True) as store:
        [runtime] = [r.runtime_id for r in store.ledger.runtimes() if r.pid == pid]
    return runtime
