"""The README is a newcomer's page that tells the truth: its example runs as written, its
set-up commands are the ones CI runs, its code imports only the public face, and every
link and path it gives leads somewhere. The same holds for the links of the docs it sends
readers to, since "moved to the guide" is only true if the link resolves."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

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
    assert "controlplane/_facade.py" in named
    assert "actors/supervisor.py" in named

    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"
