"""The store logs under its own module names, and stays quiet unless the host configures
logging: the `persistence` package logger has a NullHandler, as pykka's does."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from controlplane import ChildMeta, SubagentControlError
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import message


def test_the_persistence_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("persistence").handlers
    assert any(isinstance(handler, logging.NullHandler) for handler in handlers)


def test_a_retry_is_logged_under_the_retry_module_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    child_id = str(uuid.uuid4())
    with SqlStore(
        f"sqlite:///{path}?timeout=0.01", retry=RetryPolicy.immediate(max_attempts=2)
    ) as store:
        store.create_child(ChildMeta(child_id=child_id, parent_session="p", depth=1))
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with (
                caplog.at_level(logging.WARNING, logger="persistence"),
                pytest.raises(SubagentControlError),
            ):
                store.append(child_id, [message(1)])
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    retried = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert [r.name for r in retried] == ["persistence._retry"]


@pytest.mark.slow  # measured: 11 s under load (--durations)
def test_importing_the_store_alone_prints_nothing_on_a_warning() -> None:
    # Without a handler anywhere, logging's last resort would print the warning to stderr.
    code = "import logging, persistence\nlogging.getLogger('persistence._retry').warning('heard')\n"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stderr == ""
