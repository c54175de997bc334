"""What the console shows, read from the store: frozen views, no HTML.

Every view is read whole from the store on each call, so any process on it shows the same
thing, after any restart, whichever runtime wrote it. The overview is a handful of reads
however many children there are (`persistence.StoreOverview`); a child's page reads its
transcript once. The same views are served as JSON under ``/api/`` and as HTML.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from controlplane.contract import (
    ApprovalRequest,
    ChildMeta,
    ErrorCode,
    EventKind,
    RuntimeInfo,
    SessionEvent,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    Usage,
    usage_of,
    utcnow,
)

if TYPE_CHECKING:
    from persistence import KeyedTask, SqlStore

__all__ = [
    "ChildPage",
    "ChildRowView",
    "Group",
    "Overview",
    "RuntimeView",
    "RuntimesPage",
    "TurnUsage",
    "child_page",
    "overview",
    "runtimes_page",
]

Group = Literal["needs", "working", "completed"]
GROUP_TITLES: Final[dict[Group, str]] = {
    "needs": "Needs you",
    "working": "Working",
    "completed": "Completed",
}


@dataclass(frozen=True, slots=True)
class ChildRowView:
    """One child as the overview lists it: its header, its newest Task (if any) and what it
    spent with everything it started."""

    meta: ChildMeta
    task: TaskSnapshot | None
    tokens: int
    cost: float | None
    group: Group
    provider: str | None = None
    """Its descriptor's provider (None: no descriptor, or a store older than version 11)."""
    model: str | None = None
    """Its descriptor's model selector (``agent_model``), if it names one."""
    orphaned: bool = False
    """Its unsettled Task's runtime ended (closed, or its lease lapsed): the Task waits,
    ``running`` or ``queued``, for a runtime with the child's provider to carry it on."""

    @property
    def provider_model(self) -> str:
        """``provider:model`` as the page shows it (``-`` for what is not known)."""
        return f"{self.provider or '-'}:{self.model or '-'}"

    @property
    def status(self) -> str:
        """Its newest Task's status as a person reads it (``queued #2``, ``input_required
        deploy``); ``idle`` when it has none."""
        task = self.task
        if task is None:
            return "idle"
        if task.request is not None:
            said = f"{task.status.value} {task.request.tool}"
        elif task.queue_position is not None:
            said = f"{task.status.value} #{task.queue_position}"
        elif task.outcome is not None and task.outcome.code is ErrorCode.BUDGET_EXHAUSTED:
            said = "stopped by budget"
        else:
            said = str(task.status.value)
        return said + recovery_note(task, self.orphaned, self.provider)

    def as_json(self) -> dict[str, Any]:
        """The row under ``/api/overview``."""
        return {
            "child_id": self.meta.child_id,
            "parent_session": self.meta.parent_session,
            "depth": self.meta.depth,
            "label": self.meta.label,
            "created_at": self.meta.created_at.isoformat(),
            "group": self.group,
            "status": self.status,
            "provider": self.provider,
            "model": self.model,
            "task": None if self.task is None else self.task.model_dump(mode="json"),
            "recoveries": 0 if self.task is None else self.task.recoveries,
            "waits_for_runtime": self.orphaned,
            "waits_for_provider": self.provider if self.orphaned else None,
            "tokens": self.tokens,
            "cost": self.cost,
        }


@dataclass(frozen=True, slots=True)
class Overview:
    """Every child, grouped, and the tree of sessions, children and grandchildren."""

    rows: list[ChildRowView]
    roots: list[str]
    """The top-level sessions (parents that are not children), oldest child first."""
    under: dict[str, list[ChildRowView]]
    """The children of each session or child, by its id, oldest first."""
    read_at: datetime

    def group(self, name: Group) -> list[ChildRowView]:
        """The children of one group, newest Task first."""
        rows = [row for row in self.rows if row.group == name]
        return sorted(rows, key=_recency, reverse=True)

    def as_json(self) -> dict[str, Any]:
        """The whole overview under ``/api/overview``."""
        return {
            "read_at": self.read_at.isoformat(),
            "groups": {name: [row.as_json() for row in self.group(name)] for name in GROUP_TITLES},
            "sessions": self.roots,
        }


_CARRIED: Final = (TaskStatus.RUNNING, TaskStatus.QUEUED)


def recovery_note(task: TaskSnapshot, orphaned: bool, provider: str | None) -> str:
    """What the status adds for recovery: `` · recovered ×2`` once other runtimes
    carried its turn on, `` · waits for a runtime with provider 'x'`` while its runtime is
    gone (the provider named when the store knows it; a settled Task waits for nothing)."""
    said = f" · recovered ×{task.recoveries}" if task.recoveries else ""
    if orphaned and not task.status.is_terminal:
        said += (
            f" · waits for a runtime with provider {provider!r}"
            if provider
            else " · waits for a runtime to carry it on"
        )
    return said


def orphaned_tasks(store: SqlStore, tasks: list[TaskSnapshot]) -> set[str]:
    """The ids of those unsettled Tasks (running or queued) whose runtime ended: closed,
    its lease lapsed, or gone from the store (one read of the runtimes, only when one is
    unsettled)."""
    from persistence import is_expired

    held = [t for t in tasks if t.status in _CARRIED and t.runtime_id is not None]
    if not held or not store.keeps_tasks:
        return set()
    now = store.ledger.lease_now(utcnow())
    alive = {r.runtime_id for r in store.ledger.runtimes() if not is_expired(r, now)}
    return {t.id for t in held if t.runtime_id not in alive}


def _recency(row: ChildRowView) -> datetime:
    return row.task.created_at if row.task is not None else row.meta.created_at


def overview(store: SqlStore) -> Overview:
    """Every child of the store, each with its newest Task and its spend (a few reads)."""
    children = store.overview.children()
    names = store.overview.names()
    latest = store.overview.latest_tasks() if store.keeps_tasks else {}
    spend = store.overview.child_spend() if store.keeps_tasks else {}
    tasks = store.queue.with_places(list(latest.values()))
    waiting = [t.id for t in tasks if t.status is TaskStatus.INPUT_REQUIRED]
    requests = store.approvals.of_tasks(waiting) if waiting else {}
    by_child = {
        t.child_id: t.model_copy(update={"request": requests[t.id]}) if t.id in requests else t
        for t in tasks
    }
    orphaned = orphaned_tasks(store, tasks)
    rows = []
    for meta in children:
        task = by_child.get(meta.child_id)
        spent = spend.get(meta.child_id)
        provider, model = names.get(meta.child_id, (None, None))
        rows.append(
            ChildRowView(
                meta=meta,
                task=task,
                tokens=spent.spent.tokens if spent is not None else 0,
                cost=spent.spent.cost if spent is not None and spent.spent.cost else None,
                group=_group_of(task),
                provider=provider,
                model=model,
                orphaned=task is not None and task.id in orphaned,
            )
        )
    under: dict[str, list[ChildRowView]] = defaultdict(list)
    for row in rows:
        under[row.meta.parent_session].append(row)
    ids = {meta.child_id for meta in children}
    roots = list(dict.fromkeys(m.parent_session for m in children if m.parent_session not in ids))
    return Overview(rows=rows, roots=roots, under=dict(under), read_at=utcnow())


def _group_of(task: TaskSnapshot | None) -> Group:
    if task is None:
        return "completed"
    if task.status is TaskStatus.INPUT_REQUIRED:
        return "needs"
    if task.outcome is not None and task.outcome.code is ErrorCode.BUDGET_EXHAUSTED:
        return "needs"  # stopped by a budget: a person raises it (or lets it be)
    if task.status in (TaskStatus.RUNNING, TaskStatus.QUEUED):
        return "working"
    return "completed"


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one turn spent."""

    turn: int
    usage: Usage


@dataclass(frozen=True, slots=True)
class ChildPage:
    """One child: header, transcript, Tasks (newest first), the pending request, spend."""

    meta: ChildMeta
    events: list[SessionEvent]
    tasks: list[TaskSnapshot]
    request: ApprovalRequest | None
    turns: list[TurnUsage]
    total: Usage
    provider: str | None
    models: list[str]
    budget: dict[str, float] | None
    children: list[ChildMeta] = field(default_factory=list)
    orphaned: bool = False
    """Its unsettled Task's runtime ended: it waits for a runtime with its provider."""

    @property
    def running(self) -> TaskSnapshot | None:
        """Its unsettled Task (running, queued or waiting on a request), if any."""
        return next((t for t in self.tasks if not t.status.is_terminal), None)

    def as_json(self) -> dict[str, Any]:
        """The child under ``/api/children/{id}``."""
        return {
            "child": self.meta.model_dump(mode="json"),
            "provider": self.provider,
            "models": self.models,
            "budget": self.budget,
            "request": None if self.request is None else self.request.model_dump(mode="json"),
            "waits_for_runtime": self.orphaned,
            "waits_for_provider": self.provider if self.orphaned else None,
            "tasks": [t.model_dump(mode="json") for t in self.tasks],
            "usage": {
                "total": self.total.model_dump(mode="json"),
                "turns": [{"turn": t.turn, **t.usage.model_dump(mode="json")} for t in self.turns],
            },
            "children": [c.model_dump(mode="json") for c in self.children],
            "events": [e.model_dump(mode="json") for e in self.events],
        }


def child_page(store: SqlStore, child_id: str) -> ChildPage:
    """One child's page, read from the store.

    Raises:
        SubagentControlError: ``CHILD_NOT_FOUND`` for an id the store does not have.
    """
    session = store.load(child_id)  # first: an unknown id fails before anything else
    tasks = store.overview.tasks_of(child_id) if store.keeps_tasks else []
    tasks = store.queue.with_places(tasks)
    waiting = [t.id for t in tasks if t.status is TaskStatus.INPUT_REQUIRED]
    requests = store.approvals.of_tasks(waiting) if waiting else {}
    tasks = [
        t.model_copy(update={"request": requests[t.id]}) if t.id in requests else t for t in tasks
    ]
    request = next((t.request for t in tasks if t.request is not None), None)
    own = session.own_events
    by_turn: dict[int, list[SessionEvent]] = defaultdict(list)
    for event in own:
        by_turn[event.turn].append(event)
    turns = [TurnUsage(turn, usage_of(events)) for turn, events in sorted(by_turn.items())]
    tasks = _with_turn_usage(tasks, own, {t.turn: t.usage for t in turns})
    budget = None
    orphaned = orphaned_tasks(store, tasks)
    if store.keeps_tasks:
        found = store.spend.read([f"child:{child_id}"]).get(f"child:{child_id}")
        budget = found.budget if found is not None else None
    return ChildPage(
        meta=session.meta,
        events=session.events,
        tasks=tasks,
        request=request,
        turns=turns,
        total=usage_of(own),
        provider=_descriptor_field(own, "provider"),
        models=_models_of(own) or _listed(_descriptor_field(own, "agent_model")),
        budget=budget,
        children=store.list_children(child_id),
        orphaned=any(t.id in orphaned for t in tasks if not t.status.is_terminal),
    )


def _with_turn_usage(
    tasks: list[TaskSnapshot], events: list[SessionEvent], spent: dict[int, Usage]
) -> list[TaskSnapshot]:
    """``tasks``, each unsettled one with what its turn has spent so far, from the events
    the page shows (its ``turn/start`` names it): a Task row keeps its spend only once it
    settles, summed from the same events, so the Tasks table and the Usage line agree."""
    turn_of: dict[str, int] = {}
    for event in events:
        if event.kind == EventKind.TURN_START and isinstance(event.data, dict):
            task_id = event.data.get("task_id")
            if isinstance(task_id, str):
                turn_of[task_id] = event.turn
    return [
        t.model_copy(update={"usage": spent.get(turn_of[t.id], t.usage)})
        if not t.status.is_terminal and t.id in turn_of
        else t
        for t in tasks
    ]


def _descriptor_field(events: list[SessionEvent], name: str) -> str | None:
    """``name`` of its newest descriptor (the overview shows the same, from the header)."""
    for event in reversed(events):
        if event.kind == EventKind.DESCRIPTOR and isinstance(event.data, dict):
            value = event.data.get(name)
            return value if isinstance(value, str) else None
    return None


def _listed(value: str | None) -> list[str]:
    return [] if value is None else [value]


def _models_of(events: list[SessionEvent]) -> list[str]:
    """The models its calls reported, in the order first seen."""
    found: dict[str, None] = {}
    for event in events:
        data = event.data
        if isinstance(data, dict):
            usage = data.get("usage")
            model = usage.get("model") if isinstance(usage, dict) else None
            model = model if isinstance(model, str) else data.get("model")
            if isinstance(model, str) and model:
                found[model] = None
    return list(found)


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """A runtime on the store, whether its lease is alive, and what it holds."""

    info: RuntimeInfo
    alive: bool
    holds: list[tuple[str, str | None, int]]


@dataclass(frozen=True, slots=True)
class RuntimesPage:
    """The store's runtimes and each concurrency key's unsettled Tasks."""

    runtimes: list[RuntimeView]
    queues: dict[str, list[KeyedTask]]

    def as_json(self) -> dict[str, Any]:
        """The page under ``/api/runtimes``."""
        return {
            "runtimes": [
                r.info.model_dump(mode="json")
                | {
                    "alive": r.alive,
                    "holds": [{"child_id": c, "task_id": t, "fence": f} for c, t, f in r.holds],
                }
                for r in self.runtimes
            ],
            "queues": {
                key: [
                    {
                        "task_id": k.task_id,
                        "state": k.state,
                        "status": k.status,
                        "label": k.label,
                        "child_id": k.child_id,
                    }
                    for k in keyed
                ]
                for key, keyed in self.queues.items()
            },
        }


def runtimes_page(store: SqlStore) -> RuntimesPage:
    """The runtimes and the queues, read from the store."""
    from persistence import is_expired

    if not store.keeps_tasks:
        return RuntimesPage(runtimes=[], queues={})
    runtimes = store.ledger.runtimes()
    claims = store.ledger.claims()
    now = store.ledger.lease_now(utcnow())
    queues: dict[str, list[KeyedTask]] = defaultdict(list)
    for keyed in store.overview.keyed_tasks():
        queues[keyed.key].append(keyed)
    return RuntimesPage(
        runtimes=[
            RuntimeView(info=r, alive=not is_expired(r, now), holds=claims.get(r.runtime_id, []))
            for r in runtimes
        ],
        queues=dict(queues),
    )


def require_child(error: SubagentControlError) -> bool:
    """Whether ``error`` says the child is not there (a 404, not a failure)."""
    return error.code is ErrorCode.CHILD_NOT_FOUND
