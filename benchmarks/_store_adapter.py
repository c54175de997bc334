"""The ``## Store`` section comes from `benchmarks.store` (owned by the store's engineer)."""

from __future__ import annotations

import importlib
from pathlib import Path

from benchmarks._report import Section

__all__ = ["run_store_section"]


def run_store_section(*, quick: bool, workdir: Path, pg_url: str | None) -> Section | None:
    """The store benchmark's section, or None while `benchmarks.store` does not exist."""
    try:
        store = importlib.import_module("benchmarks.store")
    except ImportError:
        return None
    if hasattr(store, "run_section"):
        section = store.run_section(quick=quick, workdir=workdir, pg_url=pg_url)
        assert isinstance(section, Section)
        return section
    body = store.run(quick=quick, workdir=workdir, pg_url=pg_url)
    return Section("Store", str(body))
