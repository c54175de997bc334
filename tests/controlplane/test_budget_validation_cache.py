"""A scope's stored budget is validated once per distinct stored form (the gate reads it
before every call): the kept `Budget` is the one the stored limits make, a changed budget
gets its own, and a stored form that differs only in a limit's type (True for 1, a float
for a count) is judged on its own, not served the valid one's `Budget`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import Budget
from controlplane.runtime.spend._budgets import Budgets
from persistence import SqlStore


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Budgets]:
    store = SqlStore(f"sqlite:///{tmp_path / 'cache.db'}")
    yield Budgets(
        store.spend, session_budget=None, tree_budget=None, notice_at=None, max_tool_rounds=None
    )
    store.close()


def test_the_same_stored_budget_is_validated_once_and_a_changed_one_anew(kept: Budgets) -> None:

    first = kept.budget_of_scope("child:a", {"tokens": 100})
    again = kept.budget_of_scope("child:b", {"tokens": 100})
    raised = kept.budget_of_scope("child:a", {"tokens": 200, "model_calls": 3})

    assert first == Budget(tokens=100)
    assert again is first
    assert raised == Budget(tokens=200, model_calls=3)


def test_a_limit_of_another_type_is_judged_on_its_own(kept: Budgets) -> None:

    assert kept.budget_of_scope("child:a", {"model_calls": 1}) == Budget(model_calls=1)
    assert kept.budget_of_scope("child:a", {"model_calls": True}) is None
    assert kept.budget_of_scope("child:a", {"model_calls": 1.5}) is None
    unhashable: dict[str, Any] = {"tokens": [1]}
    assert kept.budget_of_scope("child:a", unhashable) is None  # not a budget: no limit
    assert kept.budget_of_scope("session:s", {"tokens": 1}) is None  # this runtime's option
