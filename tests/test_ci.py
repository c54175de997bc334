"""CI starts PostgreSQL where Debian's ``pg_ctlcluster`` is missing too: ``.ci/start-postgres``
falls back to ``initdb`` + ``pg_ctl`` from PATH or /usr/lib/postgresql/*/bin. Run for real
on a free port (a server of its own, stopped after), with PATH holding no PostgreSQL
program, as on a machine whose only PostgreSQL is the versioned directory."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / ".ci" / "start-postgres"
PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_ci_runs_the_readme_command_then_the_slow_tests_then_the_lowest_versions() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    readme = script.index(".venv/bin/python -m pytest\n")
    slow = script.index(".venv/bin/python -m pytest -m slow\n")
    lowest = script.index(".venv-lowest/bin/python -m pytest")
    assert ".ci/start-postgres 5432" in script
    assert readme < slow < lowest


@pytest.mark.slow
@pytest.mark.skipif(not PG_BINS, reason="needs PostgreSQL under /usr/lib/postgresql/*/bin")
@pytest.mark.timeout(180)
def test_start_postgres_uses_pg_ctl_where_there_is_no_pg_ctlcluster() -> None:
    port = _free_port()
    # Not tmp_path: the server runs as user postgres, which must reach its directory.
    home = Path(tempfile.mkdtemp(prefix="sc-pg-"))
    home.chmod(0o755)
    data = home / "pgdata"
    bin_dir = Path(PG_BINS[-1]).parent
    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PGDATA": str(data)}
    assert subprocess.run(["sh", "-c", "command -v pg_ctl"], env=env, check=False).returncode
    try:
        done = subprocess.run(
            [str(START), str(port)], env=env, capture_output=True, text=True, timeout=150,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"started PostgreSQL in {data}" in done.stderr
        listed = subprocess.run(
            [str(bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
             "-Atc", "SELECT datname FROM pg_database WHERE datname = 'test'", "postgres"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert listed.stdout.strip() == "test", listed.stderr
    finally:
        if (data / "postmaster.pid").exists():
            stop = [str(bin_dir / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate"]
            if os.getuid() == 0:
                stop = ["runuser", "-u", "postgres", "--", *stop]
            subprocess.run(stop, capture_output=True, timeout=60, check=False)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow  # two pytest runs of its own
@pytest.mark.timeout(240)
def test_the_test_command_prints_each_skip_reason_once_and_leaves_slow_tests_out() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENT_CONTROL_TEST_PG_URL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "postgres",
         "tests/cli/test_cli_options.py", "tests/cli/test_cli_tasks.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count("PostgreSQL not available") == 1, out  # not one line per test
    (line,) = [line for line in out.splitlines() if "PostgreSQL not available" in line]
    assert int(line.split()[0]) >= 5  # how many it skipped
    assert "SKIPPED [" not in out

    # pyproject's addopts leave the slow tests out; `-m slow` (as .ci/run does) runs them.
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "tests/test_ci.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "test_start_postgres_uses_pg_ctl_where_there_is_no_pg_ctlcluster" not in listed.stdout
    assert "2 deselected" in listed.stdout
