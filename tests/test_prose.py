"""Docstrings and comments say what and why: no section numbers of a SPEC the repository does
not ship, and no history of how the code came to be."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "actors", "persistence")

SECTION = re.compile(r"SPEC\s+§|(?<![\w`])§\s*\d")
"""A SPEC section cited, on one line or across a line break (``(SPEC\\n    §9``)."""
HISTORY = re.compile(r"\bused to be\b|\bwas spread\b|\bbefore recovery existed\b", re.IGNORECASE)
"""Phrases that tell how the code was, not what it does."""
DOCS = ("README.md", "docs/guide.md")
"""What a newcomer reads first: its references point at sections that ship."""


def _sources() -> list[tuple[str, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            found.append((relative, path.read_text(encoding="utf-8")))
    return found


def _hits(pattern: re.Pattern[str], text: str) -> list[int]:
    return [text.count("\n", 0, match.start()) + 1 for match in pattern.finditer(text)]


def test_no_module_of_the_packages_cites_a_spec_section() -> None:
    cited = {name: lines for name, text in _sources() if (lines := _hits(SECTION, text))}
    assert not cited, f"SPEC sections cited (name the rule instead), file: lines: {cited}"


def test_no_module_of_the_packages_tells_its_history() -> None:
    told = {name: lines for name, text in _sources() if (lines := _hits(HISTORY, text))}
    assert not told, f"history in docstrings or comments (say what and why), file: lines: {told}"


def test_the_readme_and_the_guide_cite_no_spec_section() -> None:
    cited = {
        name: lines
        for name in DOCS
        if (lines := _hits(SECTION, (ROOT / name).read_text(encoding="utf-8")))
    }
    assert not cited, f"SPEC sections cited (link the guide's section instead): {cited}"


def test_the_section_pattern_finds_a_citation_across_a_line_break() -> None:
    assert _hits(SECTION, 'x = 1\n"""Budgets (SPEC\n    §11): what a child spends."""') == [2]
    assert _hits(SECTION, "# as SPEC §9 requires") == [1]
    assert not _hits(SECTION, "# a child's budget, counted once")
