"""The tree stays lint-clean, formatted, and type-checked (mypy strict on the packages)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it comes with the [test] extra)")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_fix() -> None:
    result = _run(_tool("ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_ruff_formatted() -> None:
    result = _run(_tool("ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_passes_on_the_three_packages() -> None:
    result = _run(_tool("mypy"))
    assert result.returncode == 0, result.stdout + result.stderr
