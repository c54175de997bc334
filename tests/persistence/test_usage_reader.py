"""One reader of a stored usage (`controlplane.contract.usage_counts`): every path that
reads an event's ``data["usage"]`` or a Task row's spend counts the same entries and
skips the same ones, in whole. A bad cost (negative, infinite, NaN, a bool, a string) is
not a usage: the store's spend counters, the Task's settled spend, the transcript's sum,
the budget gate's held spend and the turn's running total all leave it out, tokens too."""

from __future__ import annotations

import math
import uuid
from typing import Any

import orjson
import pytest

from actors._spend import TurnSpend
from controlplane.contract import (
    ChildMeta,
    EventKind,
    NewEvent,
    Price,
    SessionEvent,
    TaskOutcome,
    TaskSnapshot,
    TaskStatus,
    Usage,
    read_usage,
    spent_in,
    usage_counts,
    usage_of,
    utcnow,
)
from persistence import SqlStore
from persistence._turn_usage import stored_usage, turn_usage

GOOD: dict[str, Any] = {"input_tokens": 100, "output_tokens": 20, "model_calls": 1, "cost": 0.5}
GOOD_USAGE = Usage(input_tokens=100, output_tokens=20, model_calls=1, cost=0.5)

BAD: list[Any] = [
    {"input_tokens": 7, "model_calls": 1, "cost": -1.0},
    {"input_tokens": 7, "model_calls": 1, "cost": math.inf},
    {"input_tokens": 7, "model_calls": 1, "cost": math.nan},
    {"input_tokens": 7, "model_calls": 1, "cost": True},
    {"input_tokens": 7, "model_calls": 1, "cost": "0.5"},
    {"input_tokens": 7.0, "model_calls": 1},
    {"input_tokens": True, "model_calls": 1},
    {"input_tokens": -7, "model_calls": 1},
    {"input_tokens": 7, "model_calls": 1, "currency": "EUR"},
    [7, 1],
    "7 tokens",
]
BAD_IDS = ["negative-cost", "inf-cost", "nan-cost", "bool-cost", "text-cost", "float-count",
           "bool-count", "negative-count", "unknown-key", "list", "text"]  # fmt: skip

STORABLE = {name: name not in ("inf-cost", "nan-cost") for name in BAD_IDS}
"""JSON has no infinity or NaN: such a cost never reaches a stored row."""


@pytest.mark.parametrize("entry", BAD, ids=BAD_IDS)
def test_the_reader_refuses_an_entry_that_is_not_a_usage_in_whole(entry: Any) -> None:
    assert usage_counts(entry) is None
    assert read_usage(entry) is None
    with pytest.raises(Exception):  # noqa: B017, PT011 - the model refuses what the reader refuses
        Usage.model_validate(entry)


def test_the_reader_returns_what_the_model_would() -> None:
    assert usage_counts(GOOD) == (100, 20, 0, 0, 1, 0, 0.5)
    assert read_usage(GOOD) == GOOD_USAGE == Usage.model_validate(GOOD)
    assert read_usage({"tool_calls": 1, "cost": 2}) == Usage(tool_calls=1, cost=2.0)
    assert read_usage({}) == Usage.zero()


def events(bad: Any, turn: int = 1) -> list[NewEvent]:
    return [
        NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=turn, data={"text": "a", "usage": GOOD}),
        NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=turn, data={"text": "b", "usage": bad}),
    ]


@pytest.mark.parametrize("bad", BAD, ids=BAD_IDS)
def test_every_former_reader_in_memory_skips_a_bad_entry_in_whole(bad: Any) -> None:
    written = events(bad)
    stored = [
        SessionEvent(seq=n, turn=e.turn, kind=e.kind, data=e.data, created_at=utcnow())
        for n, e in enumerate(written, 1)
    ]
    assert usage_of(stored) == GOOD_USAGE
    spent = spent_in([event.data for event in written])
    assert spent is not None
    assert (spent.tokens, spent.cost, spent.model_calls) == (120, 0.5, 1)
    if STORABLE[BAD_IDS[BAD.index(bad)]]:
        rows = [
            (n, e.turn, e.kind, orjson.dumps(e.data).decode()) for n, e in enumerate(written, 1)
        ]
        assert turn_usage(rows, 1) == GOOD_USAGE
        assert stored_usage(orjson.dumps(bad)) == Usage.zero()
    assert stored_usage(orjson.dumps(GOOD)) == GOOD_USAGE
    spend = TurnSpend(1, price=Price(input=1.0, output=1.0))
    priced = [NewEvent(kind=e.kind, turn=e.turn, data=spend.priced(e.data)) for e in written]
    assert priced[1].data == written[1].data  # not a usage: not priced either
    spend.written(priced)
    assert spend.total == GOOD_USAGE


def test_the_turn_counts_what_it_priced() -> None:
    spend = TurnSpend(1, price=Price(input=1_000_000.0, output=1_000_000.0))
    data = spend.priced({"text": "a", "usage": {"input_tokens": 3, "output_tokens": 2}})
    assert data["usage"]["cost"] == 5.0
    spend.written([NewEvent(kind=EventKind.ASSISTANT_MESSAGE, turn=1, data=data)])
    assert spend.total == Usage(input_tokens=3, output_tokens=2, cost=5.0)


@pytest.mark.parametrize("bad", [BAD[0], BAD[3], BAD[4]], ids=[BAD_IDS[0], BAD_IDS[3], BAD_IDS[4]])
def test_the_store_counts_and_settles_the_same_spend_from_a_bad_cost(
    store_url: str, bad: Any
) -> None:
    """The append's spend counters and the settled Task's spend read the same rule: before
    one reader, the counters took a bad cost's tokens (at cost 0) and the Task did not."""
    child_id = str(uuid.uuid4())
    task = TaskSnapshot(
        id=str(uuid.uuid4()), label="job", owner_session="parent-1", status=TaskStatus.RUNNING,
        child_id=child_id, runtime_id="runtime-1", created_at=utcnow(),
    )  # fmt: skip
    with SqlStore(store_url) as store:
        store.ledger.admit(task)
        meta = ChildMeta(child_id=child_id, parent_session="parent-1", depth=1)
        opening = NewEvent(kind=EventKind.TURN_START, turn=1, data={"task_id": task.id})
        store.create_child(meta, [opening], claim=("runtime-1", task.id))
        store.append(child_id, events(bad))
        end = NewEvent(kind=EventKind.TURN_END, turn=1, data={})
        outcome = TaskOutcome(status=TaskStatus.COMPLETED, output="done")
        store.append(child_id, [end], settle=(task.id, outcome, utcnow()))
        counted = store.spend.read([f"child:{child_id}"])[f"child:{child_id}"].spent
        assert (counted.tokens, counted.cost, counted.model_calls) == (120, 0.5, 1)
        settled = store.ledger.get(task.id)
        assert settled is not None
        assert settled.usage == GOOD_USAGE
        assert usage_of(store.load(child_id).own_events) == GOOD_USAGE
