"""The agent registry: live agent sessions that can own Tasks and children."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

from controlplane.contract._content import ModelSelector
from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._json import storable_text

__all__ = ["AgentHandle", "AgentRegistry"]

log = logging.getLogger(__name__)

_serials = itertools.count(1)
_last_serial = 0


class AgentHandle:
    """A live agent session: a parent, or a child's running agent.

    Disposing it (``dispose()``) removes it from the registry and kills every Task it owns.
    """

    __slots__ = ("_live", "_registry", "depth", "model", "serial", "session_id")

    def __init__(
        self,
        registry: AgentRegistry,
        session_id: str,
        *,
        model: ModelSelector | None,
        depth: int,
    ) -> None:
        self._registry = registry
        self.session_id = session_id
        self.model = model
        self.depth = depth
        global _last_serial
        self.serial = _last_serial = next(_serials)
        self._live = True

    @property
    def is_live(self) -> bool:
        """Whether the session is still registered (not disposed)."""
        return self._live

    @property
    def registry(self) -> AgentRegistry:
        """The registry this agent lives in (a provider registers child agents there)."""
        return self._registry

    def dispose(self) -> None:
        """End the session: unregister it and kill every Task it owns. Idempotent."""
        self._registry._dispose(self)

    def __repr__(self) -> str:
        state = "live" if self._live else "disposed"
        return f"<AgentHandle {self.session_id!r} depth={self.depth} {state}>"


class AgentRegistry:
    """Live agent sessions by session id; a second live registration of an id is refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agents: dict[str, AgentHandle] = {}
        self._dispose_hooks: list[Callable[[AgentHandle], object]] = []

    def register(
        self, session_id: str, model: ModelSelector | None = None, depth: int = 0
    ) -> AgentHandle:
        """Register a live agent session.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` if ``session_id`` is already live;
                ``INVALID_INPUT`` for an empty id or a negative depth.
        """
        if not isinstance(session_id, str) or not session_id.strip():
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "an agent session id must be a non-empty string"
            )
        storable_text(
            session_id,
            code=ErrorCode.INVALID_INPUT,
            what="agent session id",
            max_chars=200,
            nul=False,
        )
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"agent depth must be an integer >= 0, got {depth!r}"
            )
        with self._lock:
            if session_id in self._agents:
                raise SubagentControlError(
                    ErrorCode.OWNERSHIP_CONFLICT,
                    f"agent session {session_id!r} is already registered and live",
                )
            handle = AgentHandle(self, session_id, model=model, depth=depth)
            self._agents[session_id] = handle
        return handle

    def get(self, session_id: str) -> AgentHandle | None:
        """The live agent with this session id, or None."""
        return self._agents.get(session_id)

    def live(self) -> list[AgentHandle]:
        """Every live agent, in registration order."""
        with self._lock:
            return list(self._agents.values())

    @staticmethod
    def last_serial() -> int:
        """The serial of the newest handle created so far (handles are numbered in order)."""
        return _last_serial

    def on_dispose(self, hook: Callable[[AgentHandle], object]) -> None:
        """Call ``hook(handle)`` after an agent is disposed (used to kill its Tasks)."""
        with self._lock:
            self._dispose_hooks.append(hook)

    def _dispose(self, handle: AgentHandle) -> None:
        with self._lock:
            if not handle._live:
                return
            handle._live = False
            if self._agents.get(handle.session_id) is handle:
                del self._agents[handle.session_id]
            hooks = list(self._dispose_hooks)
        for hook in hooks:
            try:
                hook(handle)
            except BaseException:  # escaping, it would stop every actor
                log.exception("agent dispose hook %r failed for %r", hook, handle)
