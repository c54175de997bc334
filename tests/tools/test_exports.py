"""The public tool and asyncio modules: their export lists are decisions, frozen here."""

from __future__ import annotations

import subprocess
import sys

import controlplane.aio
import controlplane.tools


def test_the_tools_module_exports_exactly_its_public_names() -> None:
    assert controlplane.tools.__all__ == [
        "INTERNAL_ERROR",
        "MAX_MESSAGE_CHARS",
        "HumanInput",
        "ToolHandlers",
        "ToolResult",
    ]
    for name in controlplane.tools.__all__:
        assert getattr(controlplane.tools, name) is not None


def test_the_aio_module_exports_exactly_its_public_names() -> None:
    assert controlplane.aio.__all__ == ["AsyncSubagentControl"]


def test_importing_the_tools_does_not_load_the_facade_or_the_actors() -> None:
    code = (
        "import sys, controlplane.tools, controlplane.aio; "
        "print(sorted(m for m in ('controlplane._facade', 'actors', 'persistence') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
