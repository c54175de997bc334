"""The README is a newcomer's page that tells the truth: its example runs as written, its
set-up commands are the ones CI runs, its code imports only the public face, and every
link and path it gives leads somewhere. The same holds for the links of the docs it sends
readers to, since "moved to the guide" is only true if the link resolves."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.processes import LinesProcess, Reaper, reaping

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
"""Issue 25: the README is a tour, not the reference; detail lives in docs/."""

DEMO_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && "
    ".venv/bin/python examples/quickstart.py"
)
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
)

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(
    r"`((?:controlplane|actors|persistence|examples|docs|tests|benchmarks)/[\w./-]*|\.ci/run)`"
)
_DOTTED = re.compile(r"`(controlplane\.\w+)\.([A-Z]\w*)`")


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", text, re.S)


def _section(heading: str) -> str:
    text = _readme()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_the_readme_usage_example_runs(tmp_path: Path) -> None:
    (example,) = re.findall(r"## Use it\n\n```python\n(.*?)```", _readme(), re.S)
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert "TaskStatus.COMPLETED" in result.stdout
    assert (tmp_path / "state.db").exists()


def test_the_readme_stays_a_newcomers_page_of_at_most_250_lines() -> None:
    lines = len(_readme().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines: move reference detail to docs/guide.md, reliability "
        "detail to docs/reliability.md and figures to docs/benchmark-history.md, and link them"
    )


def test_the_set_up_commands_are_the_demo_and_the_test_command_ci_runs() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", _readme().split("## Use it")[0], re.S)

    assert commands == [DEMO_COMMAND, TEST_COMMAND]
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_readme_code_block_imports_only_public_names() -> None:
    imported: list[tuple[str, str]] = []
    for block in _python_blocks(_readme()):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                imported += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported += [(alias.name, "") for alias in node.names]
    named_in_prose = _DOTTED.findall(_readme())
    assert imported
    assert named_in_prose

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a name kept only for one release is not public
        for module_name, name in [*imported, *named_in_prose]:
            assert module_name.split(".")[0] == "controlplane", module_name
            assert not any(part.startswith("_") for part in module_name.split(".")), module_name
            if not name:
                continue
            module = importlib.import_module(module_name)
            public = getattr(module, "__all__", ())
            assert name in public, f"{module_name}.{name} is not public"
            getattr(module, name)


@pytest.mark.parametrize(
    "page",
    [README, *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda page: page.relative_to(ROOT).as_posix(),
)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken: list[str] = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, broken


def test_every_path_the_readme_names_exists() -> None:
    named = set(_REPO_PATH.findall(_readme()))
    assert "controlplane/runtime/_facade.py" in named
    assert "actors/supervisor.py" in named

    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


# -- every command block runs as written ----------------------------------------------------
#
# The set-up blocks are the demo and the test command (above: the same text CI runs; the
# demo's script runs below). Every other block runs here, from a directory whose `.venv`
# is this interpreter's environment, with two substitutions a reader makes too: CHILD is
# an id the demo printed, and the fixed demo socket and HTTP port become private ones (the
# machine may run other copies of this test).

DEMO_SOCKET = "/tmp/subagent-control-demo.sock"
reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture
def reader_dir() -> Iterator[Path]:
    """Where a reader runs the commands: `.venv` and `examples` as in a checkout."""
    home = Path(tempfile.mkdtemp(prefix="sc-readme-", dir="/tmp"))  # short: a socket lives here
    try:
        (home / ".venv").symlink_to(Path(sys.prefix))
        (home / "examples").symlink_to(ROOT / "examples")
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


class _Reaped:
    """A process the test started, killed and waited for pass or fail."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


def _commands(block: str) -> list[str]:
    """A block's commands, comments dropped."""
    lines = (line.split("  #", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_demo_runs_and_every_inspect_it_command_works_on_what_it_made(
    reader_dir: Path, reaped: Reaper
) -> None:
    demo = DEMO_COMMAND.rsplit(" && ", 1)[-1]
    assert demo == ".venv/bin/python examples/quickstart.py"
    socket_path = str(reader_dir / "demo.sock")
    argv = [*shlex.split(demo), "--serve", "--socket", socket_path]
    served = subprocess.Popen(
        argv, cwd=reader_dir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    reaped.add(_Reaped(served))
    assert served.stdout is not None
    printed: list[str] = []
    for _ in range(200):  # bounded: the demo prints fewer lines
        line = served.stdout.readline()
        assert line, f"the demo ended: {served.stderr.read() if served.stderr else ''}"
        if line.startswith("serving "):
            break
        printed.append(line)
    # The demo prints the commands that inspect it: the README's block, ids filled in.
    shown = [line.strip() for line in printed if line.strip().startswith(".venv/bin/")]
    (block,) = _sh_blocks(_section("Inspect it"))
    commands = _commands(block)
    (child,) = [c.split()[2] for c in shown if c.split()[1] == "transcript"]
    written = [c.replace("CHILD", child).replace(DEMO_SOCKET, socket_path) for c in commands]
    assert shown == written, (shown, written)

    for command in written:
        done = subprocess.run(
            command, shell=True, cwd=reader_dir, env=_env(), capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.strip(), command
        assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_serve_commands_start_ready_with_the_demo_provider(
    reader_dir: Path, reaped: Reaper
) -> None:
    (block,) = _sh_blocks(_section("Serve it over MCP or A2A"))
    commands = _commands(block)
    assert [c.split()[1] for c in commands] == ["mcp", "a2a"]
    for command in commands:
        argv = shlex.split(command.replace("127.0.0.1:8000", "127.0.0.1:0"))
        server = reaped.add(
            LinesProcess(reader_dir / argv[0], *argv[1:], name=argv[1], cwd=reader_dir)
        )
        if argv[1] == "a2a":
            assert server.next_line().startswith("ready http://127.0.0.1:")
        else:
            server.say(
                '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
            )  # stdio: an answer means it serves
            assert '"id":1' in server.next_line().replace(" ", "")
        assert "children start on provider 'demo'" in server.stderr()
        server.reap()


def test_the_mcp_client_config_names_whole_paths_a_desktop_host_can_start() -> None:
    text = " ".join(_section("Serve it over MCP or A2A").split())
    (config,) = re.findall(r"`(\{\"mcpServers\".*?\}\}\})`", text)
    import json

    server = json.loads(config)["mcpServers"]["subagents"]
    assert Path(server["command"]).is_absolute()
    assert server["command"].endswith("/.venv/bin/subagent-control")
    db = server["args"][server["args"].index("--db") + 1]
    assert db.startswith("sqlite:////")  # an absolute path: the host's cwd is not yours
