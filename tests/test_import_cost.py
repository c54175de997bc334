"""What a command pays before it prints: the modules it loads, not a timing.

SQLAlchemy's ORM (~280 ms of imports) and a second dialect (~90 ms) are what made every
command-line call slow; the store is written in SQLAlchemy Core and needs neither to open a
SQLite store. These tests check the set of modules a fresh interpreter holds after the
public import and after two commands; the milliseconds themselves are measured by
``python -m benchmarks --sections imports`` (docs/benchmarks.md), never asserted here.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from persistence import SqlStore
from tests.support import run_python

_NEVER = ("sqlalchemy.orm", "sqlalchemy.dialects.postgresql")


def _loaded_after(code: str) -> set[str]:
    """The module names a fresh interpreter holds after running ``code``."""
    probe = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    done = run_python("-c", probe, timeout=60.0)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in _NEVER))


def test_the_public_import_loads_no_orm_and_no_postgresql_dialect() -> None:
    loaded = _loaded_after("from controlplane import SubagentControl")
    assert "sqlalchemy" in loaded  # the probe sees the store's imports at all
    assert _heavy(loaded) == []


def test_help_loads_neither_the_store_nor_the_runtime() -> None:
    loaded = _loaded_after(
        """
        import contextlib, io
        from controlplane.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--help"]) == 0
        """
    )
    assert not {"sqlalchemy", "persistence", "actors", "pykka"} & loaded


@pytest.mark.parametrize("command", ["tasks", "children"])
def test_a_store_command_on_sqlite_loads_no_orm(tmp_path: Path, command: str) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    SqlStore(url).close()  # created here: creating a schema is not what the command does
    loaded = _loaded_after(
        f"""
        import contextlib, io
        from controlplane.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([{command!r}, "--db", {url!r}]) == 0
        """
    )
    assert "persistence" in loaded
    assert _heavy(loaded) == []
