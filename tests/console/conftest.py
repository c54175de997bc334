"""The console's tests: pages in a real browser (Playwright for Python driving the system's
Chromium; skipped, saying why, only where either cannot be had), the console as the real
command in its own process, and harness processes whose children it shows.

Every process a test starts is reaped when it ends, pass or fail (``reaped``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the console extra is not installed")
pytest.importorskip("uvicorn", reason="the console extra is not installed")

from tests.reliability.processes import reaping

reaped = pytest.fixture(reaping, name="reaped")

CHROMIUM_ENV = "SUBAGENT_CONTROL_CHROMIUM"
"""The Chromium binary the browser tests drive (else ``chromium`` on the PATH)."""


def chromium_path() -> str | None:
    """The Chromium binary to drive, or None."""
    given = os.environ.get(CHROMIUM_ENV)
    if given:
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium, driven by Playwright, for the module."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    executable = chromium_path()
    if executable is None:
        pytest.skip(
            "no Chromium to drive: install Debian's chromium (apt-get install -y chromium; "
            f".ci/run does) or point {CHROMIUM_ENV} at one"
        )
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (its own cookies) that fails the test on any error the page raised or
    any request the Content-Security-Policy blocked."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    opened.on(
        "console",
        lambda message: (
            problems.append(f"console {message.type}: {message.text}")
            if message.type == "error" and "Content Security Policy" in message.text
            else None
        ),
    )
    opened.set_default_timeout(10_000)
    try:
        yield opened
        assert problems == [], problems
    finally:
        context.close()
