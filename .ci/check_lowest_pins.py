"""Check that .ci/constraints-lowest.txt pins every direct dependency at its lower bound.

The direct dependencies are pyproject.toml's [project] dependencies and its postgres
extra. Exits non-zero, naming each mismatch, when a bound moved without its pin (or a
dependency was added without one), so the lowest-versions run tests what the package
really admits.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints-lowest.txt"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*(.*)$")
_LOWER = re.compile(r">=\s*([0-9][0-9A-Za-z.]*)")


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def _version(raw: str) -> tuple[int | str, ...]:
    parts: list[int | str] = [int(p) if p.isdigit() else p for p in raw.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # 4.1 and 4.1.0 are the same version
    return tuple(parts)


def direct_lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["postgres"]]
    bounds: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        lower = _LOWER.search(match.group(2)) if match else None
        if match is None or lower is None:
            raise SystemExit(f"{requirement!r} in pyproject.toml has no '>=' lower bound")
        bounds[_name(match.group(1))] = lower.group(1)
    return bounds


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[_name(name.strip())] = version.strip()
    return found


def main() -> int:
    pinned = pins()
    problems = [
        f"{name}: pyproject.toml says >={bound}, {CONSTRAINTS.name} pins "
        f"{pinned.get(name, 'nothing')}"
        for name, bound in direct_lower_bounds().items()
        if name not in pinned or _version(pinned[name]) != _version(bound)
    ]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
