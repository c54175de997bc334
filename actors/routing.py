"""The routing table ``child_id → supervisor``.

Written by the root (creation, shutdown) and by a retiring supervisor (its own route), under
one lock; read lock-free from any thread, so the steer path costs no hop to find its
supervisor. pykka's `ActorRegistry` lookups are linear scans; this is a dict.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pykka

from controlplane.contract import utcnow

if TYPE_CHECKING:
    from actors.supervisor import ChildSupervisorProxy

__all__ = ["Route", "RoutingTable"]


@dataclass(frozen=True, slots=True)
class Route:
    """A routing-table entry."""

    child_id: str
    supervisor: ChildSupervisorProxy
    parent_session: str | None
    created_at: datetime = field(default_factory=utcnow)


class RoutingTable:
    """``child_id → Route``; written by the root, read lock-free by any thread."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def get(self, child_id: str) -> Route | None:
        """The route of a child, if its supervisor exists (a plain dict read)."""
        return self._routes.get(child_id)

    def routes(self) -> list[Route]:
        """Every route, in creation order."""
        with self._lock:
            return list(self._routes.values())

    def __len__(self) -> int:
        return len(self._routes)

    def wait_absent(self, child_id: str, timeout_s: float) -> bool:
        """Block until ``child_id`` has no supervisor (retired, passivated, stopped);
        whether it happened within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: child_id not in self._routes, timeout_s)

    def _put(self, route: Route) -> None:
        with self._lock:
            self._routes[route.child_id] = route
            self._changed.notify_all()

    def discard(self, child_id: str, supervisor: pykka.ActorRef[Any]) -> None:
        """Remove a retiring supervisor's route, unless another has replaced it already."""
        with self._lock:
            route = self._routes.get(child_id)
            if route is not None and route.supervisor.ref is supervisor:
                del self._routes[child_id]
                self._changed.notify_all()

    def _clear(self) -> None:
        with self._lock:
            self._routes.clear()
            self._changed.notify_all()
