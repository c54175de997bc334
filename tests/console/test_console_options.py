"""``subagent-control console`` takes its providers as every front does (``--setup``,
``--demo``, ``--openai-model``): a setup that raises, or two of them at once, exit 2 with
the front's message and leave nothing running (in this process: no server starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.cli import main


def run_console(capsys: pytest.CaptureFixture[str], db: Path, *flags: str) -> tuple[int, str]:
    status = main(["console", "--db", f"sqlite:///{db}", "--http", "127.0.0.1:0", *flags])
    return status, capsys.readouterr().err


def test_a_setup_that_raises_exits_2_naming_it_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, err = run_console(
        capsys, tmp_path / "s.db", "--setup", "tests.console.console_setup:raising"
    )

    assert status == 2
    assert "--setup tests.console.console_setup:raising raised RuntimeError" in err
    assert "no model server configured" in err


def test_two_provider_options_at_once_exit_2_before_the_store_is_opened(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "s.db"

    status, err = run_console(capsys, db, "--demo", "--openai-model", "gpt-x")

    assert status == 2
    assert "give one of --openai-model, --demo, not both" in err
    assert not db.exists()
