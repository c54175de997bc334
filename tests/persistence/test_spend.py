"""The spend ledger (SPEC §11 budgets): what a child's events record spending is counted in
the append's own transaction, for the child, each ancestor child and the top-level session;
a fork's seed is not counted; a retried append counts once; a version-6 store gains the
ledger's tables.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from controlplane import ChildMeta, ErrorCode, NewEvent, SubagentControlError
from persistence import RetryPolicy, SqlStore
from persistence._schema import SCHEMA_VERSION
from tests.persistence.conftest import LostAck, raw_engine, transient_error


def spent(n: int, *, calls: int = 1, cost: float | None = None) -> NewEvent:
    usage: dict[str, object] = {"input_tokens": n, "output_tokens": 1, "model_calls": calls}
    if cost is not None:
        usage["cost"] = cost
    return NewEvent(kind="assistant/message", turn=1, data={"text": "x", "usage": usage})


def child(store: SqlStore, parent: str, *events: NewEvent, seed: int = 0) -> str:
    child_id = str(uuid.uuid4())
    meta = ChildMeta(child_id=child_id, parent_session=parent, depth=1, seed_length=seed)
    store.create_child(meta, list(events))
    return child_id


def tokens(store: SqlStore, *scopes: str) -> dict[str, int]:
    return {scope: row.spent.tokens for scope, row in store.spend.read(scopes).items()}


def test_a_grandchilds_spend_counts_for_itself_its_ancestors_and_the_session(
    store: SqlStore,
) -> None:
    top = child(store, "session-1")
    middle = child(store, top)
    bottom = child(store, middle, spent(9))

    store.append(bottom, [spent(19, cost=0.25), NewEvent(kind="tool/call", turn=1, data={})])
    store.append(middle, [spent(4)])

    assert store.spend.scopes(bottom) == (
        f"child:{bottom}", f"child:{middle}", f"child:{top}", "session:session-1",
    )  # fmt: skip
    assert tokens(store, *store.spend.scopes(bottom)) == {
        f"child:{bottom}": 30,
        f"child:{middle}": 35,
        f"child:{top}": 35,
        "session:session-1": 35,
    }
    row = store.spend.read([f"child:{top}"])[f"child:{top}"]
    assert (row.spent.model_calls, row.spent.cost) == (3, 0.25)


def test_a_chain_and_its_spend_read_in_one_statement_match_scopes_and_read(
    store: SqlStore, store_url: str
) -> None:
    top = child(store, "session-1")
    middle = child(store, top)
    bottom = child(store, middle, spent(9))
    store.append(middle, [spent(4)])
    cold = SqlStore(store_url)  # a fresh ledger: no chain known yet
    try:
        scopes, rows = cold.spend.chain_spend(bottom)
        assert scopes == store.spend.scopes(bottom)
        assert rows == store.spend.read(scopes)
        assert set(rows) == {f"child:{bottom}", f"child:{middle}", f"child:{top}",
                             "session:session-1"}  # fmt: skip
        assert cold.spend.chain_spend(bottom) == (scopes, rows)  # now from the known chain
        assert cold.spend.chain_spend("not-stored") == (("child:not-stored",), {})
        assert cold.spend.chain_spend(top)[0] == (f"child:{top}", "session:session-1")
    finally:
        cold.close()


def test_a_seed_is_not_counted_and_an_append_that_spends_nothing_writes_no_row(
    store: SqlStore,
) -> None:
    forked = child(store, "session-1", spent(1000), spent(3), seed=1)
    quiet = child(store, "session-2")
    store.append(quiet, [NewEvent(kind="steering/message", turn=1, data={"text": "hi"})])

    assert tokens(store, f"child:{forked}") == {f"child:{forked}": 4}
    assert store.spend.read([f"child:{quiet}", "session:session-2"]) == {}


def test_a_turns_seconds_are_added_with_its_end_and_bad_seconds_write_nothing(
    store: SqlStore,
) -> None:
    child_id = child(store, "session-1")
    end = NewEvent(kind="turn/end", turn=1, data={"status": "completed"})

    for bad in (-1.0, float("nan"), "2", True):
        with pytest.raises(SubagentControlError) as caught:
            store.append(child_id, [end], seconds=bad)  # type: ignore[arg-type]
        assert caught.value.code is ErrorCode.INVALID_INPUT
    assert store.load(child_id).events == []
    store.append(child_id, [end], seconds=1.5)

    row = store.spend.read([f"child:{child_id}"])[f"child:{child_id}"]
    assert row.spent.seconds == 1.5


def test_an_append_retried_after_an_unacknowledged_commit_counts_its_spend_once(
    store_url: str,
) -> None:
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as store:
        child_id = child(store, "session-1")
        lost = LostAck(transient_error(store_url))
        store._after_commit = lost  # the documented test seam

        store.append(child_id, [spent(10)])

        store._after_commit = None
        assert lost.fired == 1
        assert tokens(store, f"child:{child_id}", "session:session-1") == {
            f"child:{child_id}": 11,
            "session:session-1": 11,
        }


def test_a_childs_budget_is_written_with_its_header_and_replaced_by_set_budget(
    store: SqlStore,
) -> None:
    descriptor = NewEvent(
        kind="subagent/descriptor", turn=1,
        data={"version": 1, "provider": "p", "budget": {"tokens": 100}},
    )  # fmt: skip
    child_id = child(store, "session-1", descriptor)
    scope = f"child:{child_id}"
    assert store.spend.read([scope])[scope].budget == {"tokens": 100}

    store.spend.set_budget(child_id, {"cost": 2.5})
    assert store.spend.read([scope])[scope].budget == {"cost": 2.5}
    store.spend.set_budget(child_id, None)
    assert store.spend.read([scope])[scope].budget is None


def test_a_version_6_store_gains_the_spend_tables(sqlite_url: str) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        child_id = child(store, "session-1")
    engine = raw_engine(sqlite_url)
    with engine.begin() as conn:  # what version 6 wrote: no spend tables
        conn.execute(sa.text("DROP TABLE subagent_spend_notices"))
        conn.execute(sa.text("DROP TABLE subagent_spend"))
        conn.execute(sa.text("UPDATE subagent_schema SET version = 6"))
    engine.dispose()

    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        store.append(child_id, [spent(5)])
        assert tokens(store, f"child:{child_id}") == {f"child:{child_id}": 6}
    engine = raw_engine(sqlite_url)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION >= 8  # migrated on to the newest version


def _as_stored(store: SqlStore, child_id: str) -> None:
    """The rows the child's last counting append left for its gate are the stored rows."""
    scopes = store.spend.scopes(child_id)
    view = store.spend.view(child_id, 0)
    assert view is not None
    seen = {scope: (*counts[:6], bool(counts[6])) for scope, counts in view[1].items()}
    stored = {
        scope: (
            row.spent.tokens, row.spent.cost, row.spent.model_calls, row.spent.tool_calls,
            row.spent.seconds, row.budget, row.warned,
        )
        for scope, row in store.spend.read(scopes).items()
    }  # fmt: skip
    assert seen == stored


def test_the_rows_an_append_leaves_for_its_gate_are_the_stored_ones_whoever_else_writes(
    store: SqlStore, store_url: str
) -> None:
    # On SQLite the writer works them out from its own counting while no other connection
    # has committed: every other write, and a rolled-back append, must not fool it.
    mine = child(store, "session-1")
    for n in range(3):
        store.append(mine, [spent(5 + n, cost=0.1)])  # a cost that does not add up exactly
        _as_stored(store, mine)
    with SqlStore(store_url, retry=RetryPolicy.immediate()) as other:
        sibling = child(other, "session-1")
        other.append(sibling, [spent(11, cost=0.3)])
        store.append(mine, [spent(1)])
        _as_stored(store, mine)
        other.spend.set_budget(mine, {"tokens": 1000})
        store.append(mine, [spent(1)])
        _as_stored(store, mine)
    store.spend.set_budget(mine, {"tokens": 500})
    store.append(mine, [spent(2)])
    _as_stored(store, mine)
    assert store.spend.warn(f"child:{mine}", ("session-1", "task-1", mine, "label", "notice"))
    store.append(mine, [spent(2)])
    _as_stored(store, mine)

    def refuse(_cursor: object) -> None:
        raise SubagentControlError(ErrorCode.INVALID_INPUT, "refused inside the append")

    with pytest.raises(SubagentControlError):
        store.append(mine, [spent(1_000)], also=refuse)  # counted, then rolled back
    store.append(mine, [spent(3)])
    _as_stored(store, mine)
    assert tokens(store, f"child:{mine}")[f"child:{mine}"] == sum((5, 6, 7, 1, 1, 2, 2, 3)) + 8


@pytest.mark.parametrize(
    ("datas", "seconds"),
    [
        ([{"usage": {"input_tokens": 3, "output_tokens": 4, "model_calls": 1, "cost": 2}}], 0.0),
        ([{"usage": {"input_tokens": 3, "cost": 0.25, "tool_calls": 2}}], 1.5),
        ([{"usage": {"input_tokens": 3}}, {"usage": {"output_tokens": 1}}], 0.0),
        ([{"text": "no usage"}], 0.0),
        ([{"text": "no usage"}], 2.0),
        (["not a dict"], 0.0),
        ([{"usage": {"input_tokens": -1}}], 0.0),
        ([{"usage": {"unknown": 1}}], 3.0),
    ],
)
def test_what_an_append_counts_is_what_spent_in_reads(datas: list[object], seconds: float) -> None:
    from controlplane.contract import spent_in
    from persistence._codec import prepare_events
    from persistence._scope_spend import counted as _counted

    pending = prepare_events([NewEvent(kind="x", turn=1, data=data) for data in datas])
    expected = spent_in(datas, seconds)
    counted = _counted(pending, seconds)
    if expected is None:
        assert counted is None
    else:
        assert counted is not None
        fields = (expected.tokens, expected.cost, expected.model_calls, expected.tool_calls)
        assert counted == (*fields, expected.seconds)
        assert [type(v) for v in counted] == [type(v) for v in (*fields, expected.seconds)]
