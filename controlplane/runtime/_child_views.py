"""A parent's children as `SubagentControl.children` (and so `list_agents`) shows them:
the store's durable children and the starts still on their way, each with what its Tasks
spent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from controlplane.contract import ChildView, Usage

if TYPE_CHECKING:
    from controlplane.contract import ChildMeta, TaskSnapshot

__all__ = ["child_views", "spend_by_child"]


def child_views(tasks: Sequence[TaskSnapshot], stored: Iterable[ChildMeta]) -> list[ChildView]:
    """The children of one session, oldest first, from its Tasks (``tasks``) and the
    headers of its durable children (``stored``), read in that order: a child is durable
    from its publication on, and its initial Task runs until then, so it is in one of the
    two. (A running Task whose child the store does not have yet is a start on its way.)

    A child is ``running`` when its newest Task here is not settled."""
    latest_tasks = {t.child_id: t for t in tasks if t.child_id is not None}
    spent = spend_by_child(tasks)
    found = {
        child_id: (task.label, task.created_at)
        for child_id, task in latest_tasks.items()
        if not task.status.is_terminal  # running, or queued for a slot
    }
    for meta in stored:
        found[meta.child_id] = (meta.label or "", meta.created_at)
    views = []
    for child_id, (label, created) in found.items():
        latest = latest_tasks.get(child_id)
        views.append(
            ChildView(
                child_id=child_id,
                label=label,
                running=latest is not None and not latest.status.is_terminal,
                task_id=latest.id if latest else None,
                created_at=created,
                usage=spent.get(child_id, Usage.zero()),
            )
        )
    return sorted(views, key=lambda view: view.created_at)


def spend_by_child(tasks: Iterable[TaskSnapshot]) -> dict[str, Usage]:
    """Each child's spend as its Tasks report it (one read of the owner's Tasks, not a
    transcript per child: what `list_agents` shows)."""
    spent: dict[str, Usage] = {}
    for task in tasks:
        if task.child_id is not None and task.usage.stored():
            spent[task.child_id] = spent.get(task.child_id, Usage.zero()) + task.usage
    return spent
