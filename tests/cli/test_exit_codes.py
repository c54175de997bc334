"""Every failure of every ``subagent-control`` command exits with the status ``--help``
defines for it: one table of command × failure, each row naming the status by the words
of the help's ``exit status`` list, never by its number.

The store commands run on SQLite; a missing database driver or extra is acted out in a
fresh interpreter whose ``sys.modules`` holds None for it, as an install without the
extra would fail. The servers (``mcp``, ``a2a``, ``console``) create a store that does not
exist yet, so a missing SQLite file is not a failure of theirs.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane import ChildMeta
from controlplane.cli import main
from persistence import SqlStore
from tests.cli.cli_support import insert_requests
from tests.support import run_python

pytestmark = pytest.mark.timeout(120)

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _help_statuses() -> dict[int, str]:
    """``--help``'s exit statuses: each number with its words (continuation lines joined)."""
    done = run_python("-m", "controlplane.cli", "--help", timeout=60)
    assert done.returncode == 0, done.stderr
    listing = done.stdout.split("exit status:\n", 1)[1]
    statuses: dict[int, str] = {}
    number = None
    for line in listing.splitlines():
        found = re.match(r"^  (\d)  (.*)$", line)
        if found:
            number = int(found[1])
            statuses[number] = found[2]
        elif number is not None and line.startswith("     "):
            statuses[number] += " " + line.strip()
    return statuses


HELP: dict[int, str] = {}


def status_for(meaning: str) -> int:
    """The one status whose words in ``--help`` start with ``meaning``."""
    if not HELP:
        HELP.update(_help_statuses())
    (status,) = [n for n, words in HELP.items() if words.startswith(meaning)]
    return status


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    meaning: str  # how --help starts the status's words
    says: str  # what stderr must mention
    without: str | None = None  # a module the interpreter must not find


AMBIGUOUS = "abcd1234"
DB = "{db}"  # replaced by the populated store's URL
MISSING = "{missing}"  # replaced by a SQLite file that does not exist
SOCKET = "{socket}"  # replaced by a path where nothing serves

_STORE_COMMANDS: dict[str, tuple[str, ...]] = {
    "children": ("children",),
    "tasks": ("tasks",),
    "runtimes": ("runtimes",),
    "transcript": ("transcript", "ffff0000-lonely"),
    "answer": ("answer", "feed0000", "--allow"),
    "send": ("send", "ffff0000-lonely", "hello"),
    "kill": ("kill", "feed0000"),
}
_SERVERS: dict[str, tuple[str, ...]] = {
    "mcp": ("mcp",),
    "a2a": ("a2a", "--http", "127.0.0.1:0"),
    "console": ("console", "--http", "127.0.0.1:0"),
}
_EXTRA_MODULE = {"mcp": "mcp", "a2a": "a2a", "console": "uvicorn"}
"""A module each server's extra brings."""


def _cases() -> Iterator[object]:
    usage, not_found, unreachable = "usage error", "not found", "unreachable"
    for name, argv in {**_STORE_COMMANDS, **_SERVERS}.items():
        # A server without its extra says so first (its own case below): these need it.
        needs = _EXTRA_MODULE.get(name)
        yield _case(f"{name}-bad-url", (*argv, "--db", "nonsense"), usage, "nonsense",
                    needs=needs)  # fmt: skip
        yield _case(f"{name}-unsupported-db", (*argv, "--db", "mysql://u@h/db"), usage, "mysql",
                    needs=needs)  # fmt: skip
        yield _case(
            f"{name}-missing-driver",
            (*argv, "--db", PG_URL),
            usage,
            "subagent-control[postgres]",
            without="psycopg",
            needs=needs,
        )
    for name, argv in _STORE_COMMANDS.items():
        yield _case(f"{name}-missing-sqlite-file", (*argv, "--db", MISSING), not_found, "no SQLite")
        yield _case(f"{name}-no-db", argv, usage, "--db")
    yield _case("transcript-unknown-child", ("transcript", "eeee0000", "--db", DB), not_found,
                "no child 'eeee0000'")  # fmt: skip
    yield _case("answer-unknown-request", ("answer", "eeee0000", "--db", DB, "--deny"),
                not_found, "no request 'eeee0000'")  # fmt: skip
    yield _case("kill-unknown-task", ("kill", "eeee0000", "--db", DB), not_found,
                "no task 'eeee0000'")  # fmt: skip
    yield _case("send-unknown-child", ("send", "eeee0000", "hi", "--db", DB), not_found,
                "no child 'eeee0000'")  # fmt: skip
    yield _case("send-raising-setup", ("send", "ffff0000-lonely", "hi", "--db", DB, "--setup",
                "tests.cli.act_setup:explode"), usage, "raised RuntimeError")  # fmt: skip
    yield _case("transcript-ambiguous-prefix", ("transcript", AMBIGUOUS, "--db", DB), usage,
                "is ambiguous")  # fmt: skip
    yield _case("answer-ambiguous-prefix", ("answer", "feed", "--db", DB, "--allow"), usage,
                "is ambiguous")  # fmt: skip
    for name in ("tree", "top"):
        yield _case(f"{name}-unreachable-socket", (name, "--socket", SOCKET), unreachable,
                    "no admin socket")  # fmt: skip
        yield _case(f"{name}-no-socket-argument", (name,), usage, "--socket")
    yield _case("mcp-missing-extra", ("mcp", "--db", DB), usage, "subagent-control[mcp]",
                without="mcp")  # fmt: skip
    yield _case("a2a-missing-extra", (*_SERVERS["a2a"], "--db", DB), usage,
                "subagent-control[a2a]", without="a2a")  # fmt: skip
    yield _case("console-missing-extra", (*_SERVERS["console"], "--db", DB), usage,
                "subagent-control[console]", without="uvicorn")  # fmt: skip
    yield _case("unknown-command", ("frobnicate",), usage, "invalid choice")


def _case(
    name: str,
    argv: tuple[str, ...],
    meaning: str,
    says: str,
    *,
    without: str | None = None,
    needs: str | None = None,
) -> object:
    missing = needs is not None and importlib.util.find_spec(needs) is None
    marks = pytest.mark.skip(reason=f"the {needs} extra is not installed") if missing else ()
    return pytest.param(Case(argv, meaning, says, without), id=name, marks=marks)


@pytest.fixture
def places(tmp_path: Path, sock_dir: Path) -> dict[str, str]:
    """A SQLite store with children and requests sharing prefixes, and paths to nothing."""
    db = f"sqlite:///{tmp_path}/state.db"
    with SqlStore(db) as store:
        for child_id in (f"{AMBIGUOUS}-1", f"{AMBIGUOUS}-2", "ffff0000-lonely"):
            store.create_child(ChildMeta(child_id=child_id, parent_session="p", depth=1))
    insert_requests(db, ["feed0000", "feed0001"])
    return {
        DB: db,
        MISSING: f"sqlite:///{tmp_path}/missing.db",
        SOCKET: str(sock_dir / "none.sock"),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_each_failure_exits_with_the_status_help_gives_it(
    case: Case, places: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [places.get(arg, arg) for arg in case.argv]
    if case.without is None:
        status = main(argv)
        err = capsys.readouterr().err
    else:
        script = (
            f"import sys; sys.modules[{case.without!r}] = None; "
            "from controlplane.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        done = run_python("-c", script, *argv, timeout=60)
        status, err = done.returncode, done.stderr

    assert status == status_for(case.meaning), err
    assert case.says in err
    assert "Traceback" not in err


def test_help_gives_every_status_the_cli_uses() -> None:
    from controlplane.cli import _exit_status

    used = {
        value
        for name, value in vars(_exit_status).items()
        if name.startswith("EXIT_") and isinstance(value, int)
    }
    assert used == set(_help_statuses())
