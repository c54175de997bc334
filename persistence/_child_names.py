"""A child's provider and model as its header keeps them (`children_table`: ``provider``,
``model``), so a view of every child names them without reading a transcript (the console).

They are copied from the child's descriptor event when its header is written (the
descriptor is written with the header, once), and, for a store older than those columns,
from the descriptor events it already holds (version 11's migration): its children's open
rows, and the sealed segments that hold one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from controlplane.contract import Descriptor, EventKind
from persistence._codec import PendingEvent, from_json
from persistence._schema import children_table, events_table, segments_table

__all__ = ["backfill_child_names", "descriptor_names"]

_VERSION = Descriptor.model_fields["version"].default
_E = events_table.c
_G = segments_table.c
_OPEN_DESCRIPTORS = select(_E.child_id, _E.seq, _E.data).where(_E.kind == bindparam("kind"))
_SEALED_DESCRIPTORS = select(_G.child_id, _G.events).where(_G.events.like(bindparam("mark")))


def descriptor_names(pending: Iterable[PendingEvent]) -> dict[str, str | None]:
    """The ``provider`` and ``model`` header columns from the newest descriptor among a new
    child's first events (both None when there is none)."""
    found: dict[str, str | None] = {"provider": None, "model": None}
    for event in pending:
        if event.kind == EventKind.DESCRIPTOR:
            found = _names(event.data) or found
    return found


def backfill_child_names(conn: Connection) -> None:
    """Copy every stored child's descriptor names into its header (the newest descriptor
    of each child, as `fold_descriptor` reads it)."""
    newest: dict[str, tuple[int, dict[str, str | None]]] = {}

    def keep(child_id: str, seq: int, data: Any) -> None:
        names = _names(from_json(data) if isinstance(data, str | bytes) else data)
        current = newest.get(child_id)
        if names is not None and (current is None or seq > current[0]):
            newest[child_id] = (seq, names)

    for child_id, seq, data in conn.execute(_OPEN_DESCRIPTORS, {"kind": EventKind.DESCRIPTOR}):
        keep(child_id, seq, data)
    sealed = conn.execute(_SEALED_DESCRIPTORS, {"mark": f"%{EventKind.DESCRIPTOR}%"})
    for child_id, events in sealed:
        for seq, _turn, kind, data, *_rest in from_json(events):
            if kind == EventKind.DESCRIPTOR:
                keep(child_id, seq, data)
    if not newest:
        return
    statement = (
        update(children_table)
        .where(children_table.c.child_id == bindparam("id"))
        .values(provider=bindparam("provider"), model=bindparam("model"))
    )
    conn.execute(statement, [{"id": child, **names} for child, (_s, names) in newest.items()])


def _names(data: Any) -> dict[str, str | None] | None:
    """The names in a descriptor's data, or None for one `fold_descriptor` would skip."""
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return None
    provider, model = data.get("provider"), data.get("agent_model")
    if not isinstance(provider, str):
        return None
    return {"provider": provider, "model": model if isinstance(model, str) else None}
