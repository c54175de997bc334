"""The spend ledger's hand-written SQL (`persistence._spend`), built once per placeholder
style from the table names: only those constants and placeholders are ever joined in."""

from __future__ import annotations

from dataclasses import dataclass

from persistence._schema import CHILDREN, SPEND, SPEND_NOTICES, TASKS

__all__ = ["SpendStatements"]


@dataclass(frozen=True, slots=True)
class SpendStatements:
    """The spend ledger's statements, with the driver's placeholder ``p``."""

    parent: str
    add_head: str
    add_row: str
    add: str
    set_budget: str
    warn: str
    claim_task: str
    task_label: str
    notice: str
    noticed: str
    drain: str
    read_prefix: str
    chain_spend: str
    p: str

    @classmethod
    def build(cls, p: str) -> SpendStatements:
        return cls(
            parent=f"SELECT parent_session FROM {CHILDREN} WHERE child_id = {p}",
            add_head=(
                f"INSERT INTO {SPEND} (scope, tokens, cost, model_calls, tool_calls, seconds, "
                f"warned) VALUES "
            ),
            add_row=f"({p}, {p}, {p}, {p}, {p}, {p}, 0)",
            add=(
                f" ON CONFLICT (scope) DO "
                f"UPDATE SET tokens = {SPEND}.tokens + excluded.tokens, "
                f"cost = {SPEND}.cost + excluded.cost, "
                f"model_calls = {SPEND}.model_calls + excluded.model_calls, "
                f"tool_calls = {SPEND}.tool_calls + excluded.tool_calls, "
                f"seconds = {SPEND}.seconds + excluded.seconds"
            ),
            set_budget=(
                f"INSERT INTO {SPEND} (scope, tokens, cost, model_calls, tool_calls, seconds, "
                f"budget, warned) VALUES ({p}, 0, 0, 0, 0, 0, {p}, 0) ON CONFLICT (scope) "
                f"DO UPDATE SET budget = excluded.budget, warned = 0"
            ),
            # An UPDATE, not an upsert: a scope with no row has spent nothing stored yet
            # (a child not yet published), and its row must come with its budget.
            warn=f"UPDATE {SPEND} SET warned = 1 WHERE scope = {p} AND warned = 0",
            claim_task=f"SELECT claim_task FROM {CHILDREN} WHERE child_id = {p}",
            task_label=f"SELECT label FROM {TASKS} WHERE task_id = {p}",
            notice=(
                f"INSERT INTO {SPEND_NOTICES} (notice_id, owner_session, task_id, child_id, "
                f"label, summary, created_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})"
            ),
            noticed=f"SELECT 1 FROM {SPEND_NOTICES} WHERE notice_id = {p}",
            drain=(
                f"DELETE FROM {SPEND_NOTICES} WHERE owner_session = {p} "
                f"RETURNING task_id, child_id, label, summary, created_at, notice_id"
            ),
            read_prefix=(
                f"SELECT scope, tokens, cost, model_calls, tool_calls, seconds, budget, warned "
                f"FROM {SPEND} WHERE scope IN ("
            ),
            # A child's scope chain and its rows in one statement (a resume's check on a
            # plane that has not seen the child yet): ``up`` walks the parents, each row
            # says whether it is a child (else it is the session, the chain's top).
            chain_spend=(
                f"WITH RECURSIVE up(id, depth) AS (SELECT CAST({p} AS VARCHAR(200)), 0 UNION ALL "
                f"SELECT c.parent_session, up.depth + 1 FROM up JOIN {CHILDREN} c "
                f"ON c.child_id = up.id WHERE up.depth < {p}), "
                f"named AS (SELECT up.id, up.depth, EXISTS (SELECT 1 FROM {CHILDREN} k "
                f"WHERE k.child_id = up.id) AS is_child FROM up) "
                f"SELECT named.depth, named.id, named.is_child, s.scope, s.tokens, s.cost, "
                f"s.model_calls, s.tool_calls, s.seconds, s.budget, s.warned FROM named "
                f"LEFT JOIN {SPEND} s ON s.scope = (CASE WHEN named.is_child THEN 'child:' "
                f"ELSE 'session:' END) || named.id ORDER BY named.depth"
            ),
            p=p,
        )

    def add_all(self, count: int) -> str:
        """One upsert of ``count`` scopes' rows: one statement, one round trip (PostgreSQL
        runs an ``executemany`` as one round trip per row)."""
        # Only placeholders join the statement: one row of them per scope.
        return self.add_head + ", ".join([self.add_row] * count) + self.add

    def read(self, count: int) -> str:
        # Only placeholders join the statement: one per scope of the chain.
        marks = ", ".join([self.p] * count)
        return self.read_prefix + marks + ")"
