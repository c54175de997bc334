"""What a command pays before it prints: the modules it loads, not a timing.

SQLAlchemy (about half of what the public import cost), its ORM and a second dialect, and
pydantic's models (most of what ``--help`` cost) are what made every command-line call
slow. The store is written in SQLAlchemy Core and needs it only once a store is opened; the
contract and ``persistence`` load each name's module on first use; each command's module is
imported only when it runs; the facade's module holds the class and the mixins it inherits,
and the actor system, the wings it wires and the contract's pydantic models load when a
control plane is built or used. These tests check the set of modules a fresh interpreter holds
after the public import and after commands, so a module that starts loading where it was
not is a failure here; the milliseconds themselves are measured by
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
_STORE = ("sqlalchemy", "persistence", "tenacity")
"""The store and what only it needs: loaded once a store is opened, not before."""
_RUNTIME = ("actors", "pykka", "controlplane.runtime", "controlplane.providers")
_WINGS = ("tasks", "lease", "routing", "spend", "approvals")
_FRONT_ENDS = ("controlplane.fronts._mcp_server", "controlplane.fronts._a2a", "asyncio")
_HELP_LOADS = {
    "controlplane",
    "controlplane.cli",
    "controlplane.cli._arguments",
    "controlplane.cli._exit_status",
    "controlplane.cli._main",
    "controlplane.cli._serve_commands",
    "controlplane.contract",
    "controlplane.contract._errors",
    "controlplane.contract._lazy",
    "controlplane.fronts",
    "controlplane.fronts._security",
    "controlplane.fronts._setup",
}
"""Every module of ours ``--help`` needs: the parser, the flags the fronts share with the
command line, and the errors the command line reports."""


def _loaded_after(code: str) -> set[str]:
    """The module names a fresh interpreter holds after running ``code``."""
    probe = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    done = run_python("-c", probe, timeout=60.0)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _within(loaded: set[str], *packages: str) -> list[str]:
    """The loaded modules that are one of ``packages`` or inside one of them."""
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in packages))


def _ours(loaded: set[str]) -> set[str]:
    return set(_within(loaded, "controlplane", "actors", "persistence"))


def test_the_public_import_loads_neither_the_store_nor_sqlalchemy() -> None:
    loaded = _loaded_after("from controlplane import SubagentControl")

    assert "controlplane.runtime._facade" in loaded  # the probe sees the facade's imports
    assert _within(loaded, *_STORE, *_NEVER) == []
    # The actor system, the wings the facade wires and the contract's pydantic models load
    # when a control plane is built or used, not with the class.
    assert _within(loaded, "actors", "pykka", "pydantic", "pydantic_core") == []
    assert _within(loaded, *(f"controlplane.runtime.{wing}" for wing in _WINGS)) == [
        "controlplane.runtime.approvals",
        "controlplane.runtime.approvals._approval_api",
        "controlplane.runtime.spend",
        "controlplane.runtime.spend._spend_api",
    ]  # the mixins `SubagentControl` inherits its approval and spend calls from
    assert _within(loaded, "controlplane.providers", "controlplane.fronts", "asyncio") == []


def test_opening_a_store_after_the_public_import_still_loads_no_orm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    loaded = _loaded_after(
        f"""
        from controlplane import SubagentControl
        SubagentControl.open({url!r}).close()
        """
    )
    assert "persistence._store" in loaded
    assert _within(loaded, "sqlalchemy.orm") == []


def test_importing_the_contract_or_the_store_package_builds_nothing_yet() -> None:
    """Each loads a name's module when the name is first used (the command line's error
    path needs the errors, not every pydantic model)."""
    loaded = _loaded_after(
        """
        import controlplane.contract, persistence
        from controlplane.contract import ErrorCode, SubagentControlError
        """
    )
    assert _within(loaded, "pydantic", "sqlalchemy") == []
    assert _ours(loaded) == {
        "controlplane",
        "controlplane.contract",
        "controlplane.contract._errors",
        "controlplane.contract._lazy",
        "persistence",
    }


def test_help_loads_only_the_parser_and_its_flags() -> None:
    loaded = _loaded_after(
        """
        import contextlib, io
        from controlplane.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--help"]) == 0
        """
    )
    assert _within(loaded, *_STORE, *_RUNTIME, *_FRONT_ENDS, "pydantic") == []
    assert _ours(loaded) == _HELP_LOADS
    assert "importlib.metadata" not in loaded  # read by --version only


@pytest.mark.parametrize("command", ["children"])
def test_a_store_command_on_sqlite_loads_the_store_and_no_orm_runtime_or_actor(
    tmp_path: Path, command: str
) -> None:
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
    assert "persistence._store" in loaded
    assert _within(loaded, *_NEVER) == []
    assert _within(loaded, *_RUNTIME, "controlplane.fronts._mcp_server") == []


def test_tasks_on_sqlite_reads_with_sqlite3_alone(tmp_path: Path) -> None:
    # The store's tables, SQLAlchemy and the compile of the statements were most of what
    # the command took before it printed (`persistence.sqlite_recent_tasks`).
    url = f"sqlite:///{tmp_path / 'store.db'}"
    SqlStore(url).close()
    loaded = _loaded_after(
        f"""
        import contextlib, io
        from controlplane.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["tasks", "--db", {url!r}]) == 0
        """
    )
    assert "persistence._sqlite_tasks" in loaded
    assert (
        _within(loaded, "sqlalchemy", "tenacity", "persistence._store", "persistence._schema") == []
    )
    # The Tasks' models and no others: escaping a line builds no actor-tree model.
    assert "controlplane.contract._tree" not in loaded
    assert _within(loaded, *_RUNTIME, "controlplane.fronts._mcp_server") == []
