"""No statement notifies inside a write (PostgreSQL).

A transaction that notifies takes one cluster-wide lock at commit and holds it through its
WAL flush, so every notifying write of every runtime would commit one at a time. Wake-ups
are statements of their own, sent after the write they announce has committed
(`persistence._inbox`, `persistence._queue`); this checks the SQL the store runs.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from sqlalchemy import bindparam, func, update

from persistence._dialect import PostgresSql
from persistence._inbox_sql import inbox_table
from persistence._port import StoreSql

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def _statements(bundle: Any, prefix: str = "") -> dict[str, str]:
    """Every compiled statement of a bundle of them (`persistence._port.StoreSql`), by
    its path, nested bundles included."""
    found: dict[str, str] = {}
    for field in dataclasses.fields(bundle):
        value = getattr(bundle, field.name)
        name = f"{prefix}{field.name}"
        if isinstance(value, str):
            found[name] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            found.update(_statements(value, f"{name}."))
    return found


def test_no_statement_of_the_store_notifies_in_a_write() -> None:
    notifying = {
        name: sql
        for name, sql in _statements(StoreSql.build(PostgresSql())).items()
        if "pg_notify" in sql
    }
    assert notifying, "the probe found no notifying statement at all"
    assert {name: sql for name, sql in notifying.items() if _WRITES.search(sql)} == {}


def test_the_probe_sees_a_notify_inside_a_write() -> None:
    @dataclasses.dataclass(frozen=True)
    class Bundle:
        answer: str

    i = inbox_table.c
    answer = (
        update(inbox_table)
        .values(state="answered")
        .where(i.inbox_id == bindparam("inbox_id"))
        .returning(func.pg_notify(i.sender_runtime, bindparam("payload")))
    )
    sql = PostgresSql().compile(answer, "state", "inbox_id", "payload")
    found = _statements(Bundle(answer=sql))
    assert "pg_notify" in found["answer"]
    assert _WRITES.search(found["answer"])
