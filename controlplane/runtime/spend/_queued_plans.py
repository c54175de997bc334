"""What a runtime needs to start a queued activation that a dead runtime left (its
adoption under a concurrency limit), kept with the Task's queue rows as JSON."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from controlplane.contract import (
    AgentHandle,
    Descriptor,
    MessageSource,
    NewEvent,
    TextBlock,
    utcnow,
)

if TYPE_CHECKING:
    from actors import ActivationPlan
    from controlplane.contract import (
        AgentRegistry,
        CancelSignal,
        TaskSnapshot,
    )

__all__ = ["plan_of", "plan_text", "queued_at"]


def plan_text(plan: ActivationPlan, keys: frozenset[str]) -> str:
    """What another runtime needs to start this activation itself (adoption), as JSON."""
    data: dict[str, Any] = {
        "kind": plan.kind,
        "child_id": plan.child_id,
        "parent_session": plan.parent.session_id,
        "prompt": [block.model_dump(mode="json") for block in plan.prompt],
        "source": plan.source.model_dump(mode="json"),
        "label": plan.label,
        "keys": sorted(keys),
        "queued_at": utcnow().isoformat(),
    }
    if plan.kind == "initial":
        assert plan.descriptor is not None
        data["descriptor"] = plan.descriptor.model_dump(mode="json")
        data["depth"] = plan.depth
        data["seed"] = [event.model_dump(mode="json") for event in plan.seed]
        data["created_at"] = plan.created_at.isoformat()
    return json.dumps(data, separators=(",", ":"))


def plan_of(
    data: dict[str, Any],
    agents: AgentRegistry,
    *,
    task: TaskSnapshot,
    signal: CancelSignal,
    fence: int | None,
) -> ActivationPlan:
    """The activation an adopting runtime starts from `plan_text`'s JSON."""
    from actors import ActivationPlan

    depth = data.get("depth")
    parent = AgentHandle(agents, data["parent_session"], model=None, depth=max(0, (depth or 1) - 1))
    common: dict[str, Any] = {
        "task_id": task.id,
        "child_id": data["child_id"],
        "parent": parent,
        "prompt": tuple(TextBlock.model_validate(b) for b in data["prompt"]),
        "source": MessageSource.model_validate(data["source"]),
        "signal": signal,
        "label": data["label"],
    }
    if data["kind"] == "initial":
        return ActivationPlan(
            kind="initial",
            descriptor=Descriptor.model_validate(data["descriptor"]),
            depth=depth,
            seed=tuple(NewEvent.model_validate(e) for e in data["seed"]),
            created_at=datetime.fromisoformat(data["created_at"]),
            fence=1,
            **common,
        )
    return ActivationPlan(kind=data["kind"], fence=fence, **common)


def queued_at(data: dict[str, Any]) -> datetime | None:
    """When the plan's Task entered the queue, as `plan_text` noted it."""
    text = data.get("queued_at")
    return datetime.fromisoformat(text) if isinstance(text, str) else None
