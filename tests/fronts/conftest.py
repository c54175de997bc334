"""The MCP front's tests: real SDK clients against the front in-process (the SDK's direct
transport), over stdio (``python -m controlplane.cli mcp`` as a subprocess), and over
streamable HTTP (the console script as a subprocess, reaped pass or fail).

Children run on ``tests.fronts.scripted_setup`` (a `ScriptedModel`), so runs are
deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")

from controlplane.fronts import FrontOptions, Opened, open_front
from tests.fronts.mcp_support import SETUP
from tests.reliability.processes import reaping

reaped = pytest.fixture(reaping, name="reaped")


@pytest.fixture
def opened(sqlite_url: str) -> Iterator[Opened]:
    """A control plane opened as the front opens it: echo children, parent ``mcp``."""
    front = open_front(FrontOptions(db=sqlite_url, parent="mcp", setup=f"{SETUP}:echo"))
    yield front
    front.control.close(timeout_s=10.0)


@pytest.fixture
def slow_opened(sqlite_url: str) -> Iterator[Opened]:
    """Like ``opened``, with children whose turn lasts until killed."""
    front = open_front(FrontOptions(db=sqlite_url, parent="mcp", setup=f"{SETUP}:slow"))
    yield front
    front.control.close(timeout_s=10.0)
