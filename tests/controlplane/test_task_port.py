"""The port the actors call on the Task service (the contract's `TaskService`) is small,
and every member of it is one the actors call: the ledger follows the activation's view
(`on_view`) and records what only the activation knows (its claim, its spend, its end)."""

from __future__ import annotations

import re
from pathlib import Path

from controlplane.contract import TaskService

ACTORS = Path(__file__).resolve().parents[2] / "actors"
PORT = {"claim", "discard", "meter", "on_view", "settle", "take_over_parked"}


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_task_port_has_the_few_members_the_actors_need() -> None:
    assert _members(TaskService) == PORT


def test_every_member_of_the_task_port_is_called_by_the_actors_and_nothing_else_is() -> None:
    called = {
        name
        for path in ACTORS.glob("*.py")
        for name in re.findall(r"ctx\.tasks\.(\w+)\(", path.read_text(encoding="utf-8"))
    }
    assert called == PORT
