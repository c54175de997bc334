"""Composing docs/benchmarks.md: a header, then one ``## `` section per benchmark.

Sections that were not run this time keep their text from the existing document, so
``--sections`` refreshes part of the report without erasing the rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Section", "table", "write_report"]

SECTION_ORDER = (
    "Routing",
    "Hops and transactions",
    "Cold resume",
    "Scale",
    "Durable Tasks",
    "Store",
    "Real children",
    "Admission control",
    "Usage and budgets",
)


@dataclass(frozen=True)
class Section:
    """One ``## title`` section of the report."""

    title: str
    body: str
    data: dict[str, object] = field(default_factory=dict)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(path: Path, header: str, sections: Sequence[Section]) -> None:
    """Write the report: ``header``, then the sections in `SECTION_ORDER`.

    A section known from the existing file but not in ``sections`` is kept as it was.
    """
    kept = _existing_sections(path)
    for section in sections:
        kept[section.title] = section.body.strip()
    order = [t for t in SECTION_ORDER if t in kept] + sorted(
        t for t in kept if t not in SECTION_ORDER
    )
    parts = [header.strip()]
    parts += [f"## {title}\n\n{kept[title]}" for title in order]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def _existing_sections(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    chunks = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    # chunks = [preamble, title1, body1, title2, body2, ...]
    for title, body in zip(chunks[1::2], chunks[2::2], strict=True):
        found[title.strip()] = body.strip()
    return found
