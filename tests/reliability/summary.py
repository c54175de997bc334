"""The figures of the stress and crash tests, printed, kept beside the run, and optionally
collected as JSON."""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SUMMARY_ENV = "SUBAGENT_CONTROL_RELIABILITY_SUMMARY"
"""Set to a file path to collect the figures of the stress and crash tests as JSON."""
KEPT = "summary.json"
"""The file `kept_figures` writes in the test's folder (``--basetemp`` keeps it)."""


def backend_of(store_url: str) -> str:
    """The backend a store URL names, as the summary files figures under it."""
    return "postgres" if store_url.startswith("postgresql") else "sqlite"


def write_summary(
    section: str, backend: str, figures: dict[str, Any], *, keep: Path | None = None
) -> None:
    """Print a test's figures, write them to ``keep`` (a file), if given, and merge them
    into the summary file, if one is asked for."""
    text = json.dumps({section: {backend: figures}}, indent=2, sort_keys=True, default=str)
    print(text)
    if keep is not None:
        keep.write_text(text + "\n", encoding="utf-8")
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
        json.dump(merged, out, indent=2, sort_keys=True, default=str)


@contextlib.contextmanager
def kept_figures(section: str, backend: str, folder: Path) -> Iterator[dict[str, Any]]:
    """The figures a stress run fills in as it goes, written (`write_summary`) to
    ``folder/summary.json`` when the block ends, pass or fail: a failure's text goes in as
    ``failed``, and the lock journal's counts (``folder/locks/journal``: activations
    entered, and overlaps by process) as ``lock_journal``, so a run that fails before its
    accounting still says what it saw."""
    figures: dict[str, Any] = {"failed": None}
    try:
        yield figures
    except BaseException as exc:
        figures["failed"] = f"{type(exc).__name__}: {str(exc)[:4000]}"
        raise
    finally:
        figures["lock_journal"] = _journal_counts(folder / "locks" / "journal")
        write_summary(section, backend, figures, keep=folder / KEPT)


def _journal_counts(journal: Path) -> dict[str, Any]:
    """What the per-child lock journal holds: ``<monotonic> <pid> <what> <child_id> ...``."""
    if not journal.exists():
        return {}
    lines = [line.split() for line in journal.read_text(encoding="utf-8").splitlines()]
    what = Counter(line[2] for line in lines if len(line) > 3)
    overlaps = Counter(f"{line[1]} {line[3][:8]}" for line in lines if line[2:3] == ["overlap"])
    return {"entered": what["enter"], "overlaps": what["overlap"], "overlaps_by": dict(overlaps)}
