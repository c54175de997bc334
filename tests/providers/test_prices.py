"""Prices (SPEC §11, "prices are options of open"): a model call's cost is computed from the
child's model's price when its usage is written, stored with it, and never rewritten; a
server's own cost stays; no price leaves the cost unknown (None), never zero. Bad prices
are refused at the call, nothing opened.

The server is real (`ChatServer` on 127.0.0.1, usage streamed and not); the stores are
SQLite in ``tmp_path`` and PostgreSQL when its URL is set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    ContinuableStartSpec,
    Descriptor,
    ErrorCode,
    EventKind,
    InProcessProvider,
    Price,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.contract import AgentHandle, Prices

from .openai_server import ChatServer

WAIT_S = 5.0
SERVER_USAGE = {
    "prompt_tokens": 1_200_000,
    "completion_tokens": 300_000,
    "total_tokens": 1_500_000,
    "prompt_tokens_details": {"cached_tokens": 1_000_000},
}
PRICE = Price(input=2.0, output=10.0, cached_input=0.5)
# 200k uncached input at $2/M, 1M cached at $0.5/M, 300k output at $10/M.
SERVER_COST = 0.2 * 2.0 + 1.0 * 0.5 + 0.3 * 10.0


def start(
    control: SubagentControl,
    parent: AgentHandle,
    *,
    model: str | None = "m",
    provider: str = "inprocess",
) -> str:
    started = control.start_continuable(
        ContinuableStartSpec(
            provider=provider, label="spender", prompt=[TextBlock(text="go")], parent=parent,
            agent_model=model,
        )
    )  # fmt: skip
    snapshot = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
    assert snapshot.status is TaskStatus.COMPLETED, snapshot
    return started.child_id


def recorded(control: SubagentControl, child_id: str) -> list[dict[str, Any]]:
    """The usage recorded with each assistant message of the child."""
    assert control.store is not None
    events = control.store.load(child_id).events
    return [e.data["usage"] for e in events if e.kind == EventKind.ASSISTANT_MESSAGE]


# -- the value -----------------------------------------------------------------------------


def test_a_price_costs_uncached_cached_and_output_tokens_at_their_own_rates() -> None:
    usage = Usage(input_tokens=1_200_000, cached_input_tokens=1_000_000, output_tokens=300_000)

    assert math.isclose(PRICE.cost(usage), SERVER_COST)
    # Cached input costs what input costs unless said otherwise.
    assert Price(input=2.0, output=10.0).cached_input == 2.0
    assert math.isclose(Price(input=2, output=10).cost(usage), 1.2 * 2.0 + 0.3 * 10.0)
    assert Price.model_validate({"input": 0, "output": 0}).cost(usage) == 0.0


@pytest.mark.parametrize(
    "price",
    [
        {"input": -1.0, "output": 1.0},
        {"input": 1.0, "output": float("inf")},
        {"input": 1.0, "output": float("nan")},
        {"input": "3", "output": 1.0},
        {"input": True, "output": 1.0},
        {"input": 1.0, "output": 1.0, "cached_input": -0.1},
        {"input": 1.0},
        {"input": 1.0, "output": 1.0, "reasoning": 2.0},
        "cheap",
    ],
)
def test_a_bad_price_is_an_invalid_input_error_wherever_it_is_given(
    price: Any, tmp_path: Path
) -> None:
    for make in (
        lambda: Price.model_validate(price),
        lambda: Prices({"m": price}),
    ):
        with pytest.raises(SubagentControlError) as caught:
            make()
        assert caught.value.code is ErrorCode.INVALID_INPUT
    db = tmp_path / "never.db"
    with pytest.raises(SubagentControlError) as caught:
        SubagentControl.open(f"sqlite:///{db}", prices={"m": price})
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert not db.exists()  # nothing opened


@pytest.mark.parametrize("prices", [{"": PRICE}, {"  ": PRICE}, {3: PRICE}, [("m", PRICE)]])
def test_a_bad_price_key_or_table_is_refused_at_open_and_nothing_is_opened(
    prices: Any, tmp_path: Path
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(SubagentControlError) as caught:
        SubagentControl.open(f"sqlite:///{db}", prices=prices)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert not db.exists()
    with pytest.raises(SubagentControlError) as caught:
        SubagentControl(None, prices=prices)  # the constructor checks too
    assert caught.value.code is ErrorCode.INVALID_INPUT


def test_open_takes_a_prices_table_as_the_constructor_does(store_url: str) -> None:
    prices = Prices({"m": PRICE})

    with SubagentControl.open(store_url, prices=prices) as control:
        assert control.prices is prices


def test_a_price_is_found_by_provider_and_model_first_then_by_model() -> None:
    by_model, by_pair, by_agent = (
        Price(input=1, output=1),
        Price(input=2, output=2),
        Price(input=3, output=3),
    )
    prices = Prices({"m": by_model, "inprocess:m": by_pair, "openai:o": by_agent, "o": by_model})

    def described(**fields: Any) -> Descriptor:
        return Descriptor.build(provider="inprocess", **fields)

    assert prices.for_descriptor(described(agent_model="m")) is by_pair
    assert prices.for_descriptor(described(agent_model="o", agent_provider="openai")) is by_agent
    assert prices.for_descriptor(described(agent_model="o")) is by_model
    assert prices.for_descriptor(described(agent_model="unknown")) is None
    assert prices.for_descriptor(described()) is None  # no model named: no price
    assert prices.is_priced(described(agent_model="m"))
    assert not prices.is_priced(described(agent_model="unknown"))
    assert not Prices().is_priced(described(agent_model="m"))


# -- recorded with the call ----------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running
        running.answer.set()


@pytest.mark.parametrize("stream", [True, False])
def test_a_priced_models_call_records_its_cost_with_its_usage_streamed_or_not(
    store_url: str, server: ChatServer, stream: bool
) -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    from controlplane.models import OpenAIChatModel

    server.script({"text": "counted", "usage": SERVER_USAGE})
    model = OpenAIChatModel("m", base_url=server.base_url, retry_base_s=0.01, stream=stream)
    with SubagentControl.open(store_url, prices={"m": PRICE}) as control:
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register("parent-1")
        child_id = start(control, parent)

        (usage,) = recorded(control, child_id)
        assert math.isclose(usage["cost"], SERVER_COST)
        assert math.isclose(control.usage(parent, child_id).cost or 0, SERVER_COST)


def test_a_scripted_models_calls_are_priced_and_a_reported_cost_is_kept(store_url: str) -> None:
    scripted = ScriptedModel(
        ["one", "two", "three"],
        usage=[
            Usage(input_tokens=1_000_000, output_tokens=100_000),
            Usage(input_tokens=10, cost=0.75),  # the server said what it cost: kept
            None,  # nothing reported: its cost is unknown, not zero
        ],
    )
    with SubagentControl.open(store_url, prices={"inprocess:m": PRICE}) as control:
        control.providers.register(InProcessProvider(scripted))
        parent = control.agents.register("parent-1")
        child_id = start(control, parent)
        for again in ("two", "three"):
            sent = control.send_message(parent, child_id, [TextBlock(text=again)])
            control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)

        first, second, third = recorded(control, child_id)
        assert math.isclose(first["cost"], 1.0 * 2.0 + 0.1 * 10.0)
        assert second["cost"] == 0.75
        assert "cost" not in third


def test_without_a_price_the_cost_stays_unknown(store_url: str) -> None:
    scripted = ScriptedModel(["one"], usage=Usage(input_tokens=100, output_tokens=10))
    with SubagentControl.open(store_url, prices={"other-model": PRICE}) as control:
        control.providers.register(InProcessProvider(scripted))
        parent = control.agents.register("parent-1")
        child_id = start(control, parent)

        assert "cost" not in recorded(control, child_id)[0]
        assert control.usage(parent, child_id).cost is None


def test_a_cost_is_stored_with_its_call_so_a_later_price_does_not_rewrite_it(
    store_url: str,
) -> None:
    def scripted() -> ScriptedModel:
        return ScriptedModel(["answer"], usage=Usage(input_tokens=1_000_000))

    with SubagentControl.open(store_url, prices={"m": Price(input=1, output=1)}) as first:
        first.providers.register(InProcessProvider(scripted()))
        parent = first.agents.register("parent-1")
        child_id = start(first, parent)

    with SubagentControl.open(store_url, prices={"m": Price(input=5, output=5)}) as second:
        second.providers.register(InProcessProvider(scripted()))
        parent = second.agents.register("parent-1")
        sent = second.send_message(parent, child_id, [TextBlock(text="again")])
        second.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)

        assert [u["cost"] for u in recorded(second, child_id)] == [1.0, 5.0]
        assert second.usage(parent, child_id).cost == 6.0
        assert second.prices.is_priced(Descriptor.build(provider="inprocess", agent_model="m"))
