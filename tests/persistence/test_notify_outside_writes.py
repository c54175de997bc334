"""No statement notifies inside a write (PostgreSQL).

A transaction that notifies takes one cluster-wide lock at commit and holds it through its
WAL flush, so every notifying write of every runtime would commit one at a time. Wake-ups
are statements of their own, sent after the write they announce has committed
(`persistence._inbox`, `persistence._queue`); this checks the SQL the store runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support import REPO

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def _sql_constants(path: Path) -> dict[str, str]:
    """Each module-level constant of ``path`` whose value is text, with f-strings and
    concatenations of other constants resolved as far as they are constants."""
    tree = ast.parse(path.read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and node.value is not None:
                found[target.id] = _text(node.value, found)
    return found


def _text(node: ast.expr, known: dict[str, str]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(part, known) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        return _text(node.value, known)
    if isinstance(node, ast.Name):
        return known.get(node.id, "")
    if isinstance(node, ast.BinOp):
        return _text(node.left, known) + _text(node.right, known)
    return ""


def test_no_statement_of_the_store_notifies_in_a_write() -> None:
    notifying = {
        f"{path.name}:{name}": sql
        for path in sorted((REPO / "persistence").glob("*.py"))
        for name, sql in _sql_constants(path).items()
        if "pg_notify" in sql
    }
    assert notifying, "the probe found no notifying statement at all"
    assert {name: sql for name, sql in notifying.items() if _WRITES.search(sql)} == {}


def test_the_probe_sees_a_notify_inside_a_write(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '_T = "subagent_inbox"\n'
        '_ANSWER = f"UPDATE {_T} SET state = 1 " "RETURNING pg_notify(%s, %s)"\n'
    )
    sql = _sql_constants(module)["_ANSWER"]
    assert "pg_notify" in sql
    assert _WRITES.search(sql)
