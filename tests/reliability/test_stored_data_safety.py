"""Security of stored data (SPEC §4 store, §8): nothing stored is ever executed or
unpickled, and SQL is built only with bound parameters, so hostile ids, labels and messages
are stored and read back intact on both backends."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from controlplane import ChildMeta, EventKind, MessageSource, NewEvent, SubagentControl
from tests.fakes import FakeProvider
from tests.support import settle, start_child, text

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("controlplane", "actors", "persistence")


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


FORBIDDEN = re.compile(
    r"\bpickle\b|\bcPickle\b|\bdill\b|\bshelve\b|\bmarshal\b|\beval\(|\bexec\(|yaml\.load|"
    r"\bjsonpickle\b|__import__\("
)


def python_sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def test_no_package_deserialises_stored_data_with_pickle_eval_exec_marshal_or_yaml() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in python_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert len(python_sources()) > 10
    assert found == []


def _formats_a_string(node: ast.expr) -> bool:
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(part, ast.FormattedValue) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "join", "replace")
    )


def persistence_trees() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted((REPO / "persistence").rglob("*.py"))
    ]


def test_persistence_passes_no_formatted_string_to_an_sql_call() -> None:
    offenders = []
    calls = 0
    for path, tree in persistence_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("text", "exec_driver_sql", "execute", "executemany", "executescript"):
                continue
            calls += 1
            if _formats_a_string(node.args[0]):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert calls > 5, "persistence/ issues no SQL at all? the scan is looking at the wrong code"
    assert offenders == []


SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|WHERE|VALUES)\b")
# What an SQL f-string may interpolate: the DBAPI placeholder and identifier constants.
PLACEHOLDER = "p"
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def test_sql_built_with_f_strings_interpolates_only_identifier_constants_and_placeholders() -> None:
    offenders = []
    sql_strings = 0
    for path, tree in persistence_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            literal = "".join(
                part.value
                for part in node.values
                if isinstance(part, ast.Constant) and isinstance(part.value, str)
            )
            if not SQL_WORDS.search(literal):
                continue
            sql_strings += 1
            for part in node.values:
                if not isinstance(part, ast.FormattedValue):
                    continue
                value = part.value
                ok = isinstance(value, ast.Name) and (
                    value.id == PLACEHOLDER or CONSTANT.match(value.id) is not None
                )
                if not ok or part.conversion != -1:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert sql_strings > 0, "no SQL f-string found: the scan is looking at the wrong code"
    assert offenders == []


HOSTILE = [
    "'); DROP TABLE events; --",
    "Robert'); DROP TABLE children;--",
    '" OR 1=1; --',
    "\\'; SELECT pg_sleep(5); --",
    "%s %(x)s {0} :param ?",
]


def test_sql_metacharacters_in_ids_labels_and_messages_are_stored_and_read_back_intact(
    control: SubagentControl, provider: FakeProvider
) -> None:
    assert control.store is not None
    for number, hostile in enumerate(HOSTILE):
        parent = control.agents.register(f"{hostile} parent {number}")
        start = start_child(control, parent, label=hostile, prompt=hostile)
        settle(control, start.task_id, parent)
        follow_up = control.send_message(parent, start.child_id, text(hostile, hostile))
        settle(control, follow_up.task_id, parent)

        loaded = control.store.load(start.child_id)
        assert loaded.meta.parent_session == f"{hostile} parent {number}"
        assert loaded.meta.label == hostile
        prompts = [e.data["text"] for e in loaded.events if e.kind == EventKind.USER_MESSAGE]
        assert prompts == [hostile, hostile + hostile]
        assert [c.child_id for c in control.store.list_children(parent.session_id)] == [
            start.child_id
        ]
        parent.dispose()
    # Every table is still there and still answers.
    assert len(provider.starts) == len(HOSTILE)


def test_sql_metacharacters_in_store_ids_kinds_and_data_round_trip_through_the_store(
    control: SubagentControl,
) -> None:
    store = control.store
    assert store is not None
    for number, hostile in enumerate(HOSTILE):
        child_id = f"{hostile}#{number}"
        source = MessageSource(kind="human", sender_session_id=hostile)
        event = NewEvent(kind=hostile, turn=1, data={hostile: [hostile]}, source=source)
        store.create_child(
            ChildMeta(child_id=child_id, parent_session=hostile, depth=1, label=hostile), [event]
        )
        store.append(child_id, [event, {"kind": "x", "turn": 1, "data": hostile}])

        loaded = store.load(child_id)
        assert loaded.meta.parent_session == hostile
        assert [(e.seq, e.kind, e.data, e.source) for e in loaded.events] == [
            (1, hostile, {hostile: [hostile]}, source),
            (2, hostile, {hostile: [hostile]}, source),
            (3, "x", hostile, None),
        ]
        assert [(m.child_id, m.label) for m in store.list_children(hostile)] == [
            (child_id, hostile)
        ]
    assert len(store.list_children(None)) == len(HOSTILE)
