"""One way to write SQL: the store's statements are SQLAlchemy Core, compiled per database
by its `SqlDialect`; no persistence module builds SQL text by hand (an f-string, a ``+``,
a ``%`` or a ``.format`` joining SQL words), so no value and no table name is ever spliced
into a statement."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sqlalchemy import bindparam, select

from persistence._children_sql import ChildStatements, child_table
from persistence._dialect import PostgresSql, SqlDialect, SqliteSql, constant
from persistence._port import StoreSql

PACKAGE = Path(__file__).resolve().parents[2] / "persistence"
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|WHERE|VALUES|JOIN|RETURNING|ORDER BY|GROUP BY|"
    r"ON CONFLICT|UNION|WITH \w+ AS|NOTIFY|SET \w+ =)\b"
)


def _text_of(node: ast.AST) -> str:
    """The literal text a node contributes to a string it builds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text_of(part) for part in node.values)
    if isinstance(node, ast.BinOp):
        return _text_of(node.left) + _text_of(node.right)
    return ""


def _built_sql(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module builds a string holding SQL words from parts."""
    found = []
    for node in ast.walk(tree):
        built = None
        formatted = isinstance(node, ast.JoinedStr) and any(
            isinstance(part, ast.FormattedValue) for part in node.values
        )
        if formatted or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod)):
            built = _text_of(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("format", "join")
            and isinstance(node.func.value, ast.Constant)
        ):
            built = str(node.func.value.value) + "".join(_text_of(arg) for arg in node.args)
        if built is not None and SQL_WORDS.search(built):
            found.append((getattr(node, "lineno", 0), built))
    return found


def test_no_persistence_module_builds_sql_from_strings() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 20
    built = {
        f"{path.name}:{line}": text
        for path in modules
        for line, text in _built_sql(ast.parse(path.read_text(), str(path)))
    }
    assert built == {}


@pytest.mark.parametrize(
    "source",
    [
        'f"SELECT x FROM {table} WHERE a = {p}"',
        '"DELETE FROM " + TABLE',
        '"UPDATE t SET a = %s" % value',
        '"INSERT INTO {} VALUES (?)".format(table)',
        '" UNION ALL ".join(parts)',
    ],
)
def test_the_check_finds_sql_built_by_hand(source: str) -> None:
    assert _built_sql(ast.parse(source)) != []


@pytest.mark.parametrize("dialect", [SqliteSql(), PostgresSql()], ids=lambda d: d.name)
def test_every_statement_compiles_for_each_database(dialect: SqlDialect) -> None:
    sql = StoreSql.build(dialect)
    placeholder = "?" if dialect.name == "sqlite" else "%s"
    assert sql.children.insert.count(placeholder) == 8
    assert (sql.children.lock_child is not None) is (dialect.name == "postgresql")
    assert ("FOR NO KEY UPDATE" in sql.children.claim_of) is (dialect.name == "postgresql")
    assert (sql.inbox is not None) is (dialect.name == "postgresql")
    assert (sql.queue.released is not None) is (dialect.name == "postgresql")
    assert sql.tasks.queued.endswith("'running'")  # the partial index's literal, not bound


def test_a_statement_whose_binds_are_not_in_the_given_order_is_refused() -> None:
    c = child_table.c
    query = select(c.fence).where(
        c.child_id == bindparam("child_id"), c.claim_task == bindparam("task_id")
    )
    assert SqliteSql().compile(query, "child_id", "task_id").count("?") == 2
    with pytest.raises(AssertionError, match="binds"):
        SqliteSql().compile(query, "task_id", "child_id")


def test_a_constant_is_a_plain_word() -> None:
    assert str(constant("queued")) == "'queued'"
    with pytest.raises(ValueError, match="plain constant"):
        constant("x' OR '1'='1")


def test_an_older_store_reads_without_segments() -> None:
    sql = ChildStatements.build(SqliteSql(), segments=False)
    assert "subagent_segments" not in sql.load
    assert sql.load_binds == 2


NAME_TESTED = re.compile(r"dialect\.name\s*[!=]=")
OWN_DIALECT = {"_schema.py", "_migrations.py"}
"""Modules that read SQLAlchemy's own dialect (a column type's conversion, a migration's
connection), not the store's `SqlDialect`."""


def test_no_persistence_module_tells_the_databases_apart_by_name() -> None:
    told = {
        path.name: [n for n, line in enumerate(text.splitlines(), 1) if NAME_TESTED.search(line)]
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name != "_dialect.py" and path.name not in OWN_DIALECT
        for text in [path.read_text(encoding="utf-8")]
    }
    told = {name: lines for name, lines in told.items() if lines}
    assert not told, f"ask the SqlDialect what the database can do instead: {told}"


def test_the_dialects_say_what_each_database_can_do() -> None:
    sqlite, postgres = SqliteSql(), PostgresSql()
    for capability in ("notifies", "server_clock", "round_trips", "named_sessions", "row_locks"):
        assert getattr(postgres, capability), capability
        assert not getattr(sqlite, capability), capability
    assert sqlite.blob_segments
    assert not postgres.blob_segments
