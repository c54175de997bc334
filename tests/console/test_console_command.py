"""``subagent-control console`` as the real command: it prints its address once it listens
and stops on SIGTERM; beyond loopback it asks a token (generated into a 0600 file when none
is given); without its extra it exits 2 naming the extra."""

from __future__ import annotations

import signal
import stat
from pathlib import Path

import httpx
import pytest

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
    console.proc.send_signal(signal.SIGTERM)
    assert console.proc.wait(WAIT_S) == 0


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
