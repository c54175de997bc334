"""What a newcomer types first: ``--version``, ``$SUBAGENT_CONTROL_DB``, the URL spellings
of PostgreSQL, a database that is not there, a ``--setup`` that raises, shell completion,
and a top-level ``--help`` that names every command."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from controlplane import (
    ChildMeta,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from controlplane.cli._main import _parser
from persistence import SqlStore
from tests.support import run_python

pytestmark = pytest.mark.timeout(60)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_version_prints_the_installed_version() -> None:
    done = run_python("-m", "controlplane.cli", "--version", timeout=60)
    assert done.returncode == EXIT_OK, done.stderr
    assert re.fullmatch(r"subagent-control \d+\.\d+\.\d+\S*\n", done.stdout)


def test_the_store_url_comes_from_the_environment_when_no_db_is_given(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with SqlStore(sqlite_url) as store:
        store.create_child(ChildMeta(child_id="from-the-env", parent_session="p", depth=1))
    monkeypatch.setenv("SUBAGENT_CONTROL_DB", sqlite_url)

    status, out, err = run(capsys, "children")

    assert (status, err) == (EXIT_OK, "")
    assert "from-the-env" in out


def test_without_db_or_its_variable_the_usage_error_names_both(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUBAGENT_CONTROL_DB", raising=False)
    status, _, err = run(capsys, "children")
    assert status == EXIT_USAGE
    assert "--db" in err


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_postgres_and_postgresql_urls_are_read_with_the_installed_driver(
    pg_url: str, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SqlStore(pg_url) as store:
        store.create_child(ChildMeta(child_id="on-postgres", parent_session="p", depth=1))
    plain = re.sub(r"^postgresql\+psycopg://", f"{scheme}://", pg_url)

    status, out, err = run(capsys, "children", "--db", plain)

    assert (status, err) == (EXIT_OK, "")
    assert "on-postgres" in out


@pytest.mark.postgres
def test_a_database_that_does_not_exist_is_not_found_not_unreachable(
    pg_url_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = re.sub(r"/[^/?]+(\?.*)?$", "/no_such_database_38", pg_url_base)

    status, _, err = run(capsys, "tasks", "--db", missing)

    assert status == EXIT_NOT_FOUND
    assert err.startswith("subagent-control: [STORE_NOT_FOUND]")
    assert "no_such_database_38" in err


def test_a_setup_function_that_raises_is_a_coded_usage_error_not_a_traceback(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SqlStore(sqlite_url) as store:
        store.create_child(ChildMeta(child_id="c-setup", parent_session="p", depth=1))

    status, out, err = run(capsys, "send", "c-setup", "hello", "--db", sqlite_url,
                           "--setup", "tests.cli.act_setup:explode")  # fmt: skip

    assert (status, out) == (EXIT_USAGE, "")
    assert err.startswith("subagent-control: [INVALID_INPUT] --setup tests.cli.act_setup:explode")
    assert "RuntimeError: no API key in this shell" in err
    assert "Traceback" not in err
    with SqlStore(sqlite_url, read_only=True) as store:
        assert store.load("c-setup").events == []  # nothing was sent


def test_the_top_level_help_names_every_command() -> None:
    done = run_python("-m", "controlplane.cli", "--help", timeout=60)
    assert done.returncode == EXIT_OK
    listed = set(re.findall(r"^    (\S+)  ", done.stdout, re.M))
    (commands,) = [a for a in _parser()._actions if a.dest == "command"]
    assert listed == set(commands.choices)  # type: ignore[arg-type]
    assert {"send", "kill", "completion", "mcp", "a2a"} <= listed


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("subagent-control tr", {"tree", "transcript"}),
        ("subagent-control send --s", {"--setup"}),
        ("subagent-control tasks --w", {"--watch"}),
    ],
)
def test_bash_completes_commands_and_their_options(
    tmp_path: Path, words: str, expected: set[str]
) -> None:
    script = tmp_path / "complete.bash"
    done = run_python("-m", "controlplane.cli", "completion", "bash", timeout=60)
    assert done.returncode == EXIT_OK, done.stderr
    script.write_text(done.stdout, encoding="utf-8")
    probe = (
        f"source {script}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
        '_subagent_control; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    completed = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert set(completed.stdout.split()) == expected


def test_zsh_gets_the_same_script_through_bashcompinit() -> None:
    done = run_python("-m", "controlplane.cli", "completion", "zsh", timeout=60)
    assert done.returncode == EXIT_OK
    assert done.stdout.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert "complete -o default -F _subagent_control subagent-control" in done.stdout


def test_a_send_that_resumes_a_child_without_its_provider_leaves_it_for_one_that_has_it(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SubagentControl.open(sqlite_url) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["first"])))
        parent = control.agents.register("p")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="l", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        control.tasks.wait(started.task_id, timeout=10, requester=parent)

    status, out, err = run(capsys, "send", started.child_id, "more", "--db", sqlite_url)

    assert status == EXIT_OK, err
    assert out.startswith("started task ")
    assert "waits (queued) for a runtime with provider 'inprocess'" in out
    task_id = out.split()[2]
    # The message is durable: a runtime with the provider runs the turn.
    with SubagentControl.open(sqlite_url) as worker:
        worker.providers.register(InProcessProvider(ScriptedModel(["second"])))
        parent = worker.agents.register("p")
        done = worker.tasks.wait(task_id, timeout=10, requester=parent)
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "second"
