"""Fixtures for the admin socket and the CLI tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short private directory: tmp_path named after a long test name overflows sun_path."""
    path = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
