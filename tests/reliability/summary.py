"""The figures of the stress and crash tests, printed and optionally collected as JSON."""

from __future__ import annotations

import json
import os
from typing import Any

SUMMARY_ENV = "SUBAGENT_CONTROL_RELIABILITY_SUMMARY"
"""Set to a file path to collect the figures of the stress and crash tests as JSON."""


def backend_of(store_url: str) -> str:
    """The backend a store URL names, as the summary files figures under it."""
    return "postgres" if store_url.startswith("postgresql") else "sqlite"


def write_summary(section: str, backend: str, figures: dict[str, Any]) -> None:
    """Print a test's figures and merge them into the summary file, if one is asked for."""
    print(json.dumps({section: {backend: figures}}, indent=2, sort_keys=True))
    path = os.environ.get(SUMMARY_ENV)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as existing:
            merged = json.load(existing)
    except (FileNotFoundError, json.JSONDecodeError):
        merged = {}
    merged.setdefault(section, {})[backend] = figures
    with open(path, "w", encoding="utf-8") as out:
        json.dump(merged, out, indent=2, sort_keys=True)
