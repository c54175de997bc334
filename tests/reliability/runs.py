"""What the reliability suite's hand-written providers share: a run that takes steers until
its turn settles, and a provider whose ``start`` and ``resume`` do the same thing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from controlplane import (
    AgentHandle,
    CancelSignal,
    ErrorCode,
    MessageSource,
    ResumeRequest,
    StartRequest,
    SubagentControlError,
    TextBlock,
)

__all__ = ["SettlingRun", "SymmetricProvider"]

Steer = Callable[[Sequence[TextBlock], MessageSource], None]


class SettlingRun:
    """A run without an agent of its own whose ``steer`` is accepted until `_settle`.

    The steer check and `_settle` share one lock, so a steer either lands before the turn
    settles or is refused ``NOT_DELIVERED``, as the provider contract asks.
    """

    def __init__(self, child_id: str) -> None:
        self.child_id = child_id
        self.local_agent: AgentHandle | None = None
        self.steer: Steer | None = self._steer
        self._lock = threading.Lock()
        self._settled = False

    def _settle(self) -> None:
        with self._lock:
            self._settled = True

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        with self._lock:
            if self._settled:
                raise SubagentControlError(
                    ErrorCode.NOT_DELIVERED,
                    f"the turn of child {self.child_id} has settled",
                    child_id=self.child_id,
                )


RunT = TypeVar("RunT", bound=SettlingRun)


class SymmetricProvider(Generic[RunT]):
    """A provider that begins a resumed activation exactly as a fresh one (`_begin`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The registry key."""
        return self._name

    def start(self, request: StartRequest, signal: CancelSignal) -> RunT:
        """Begin the child's first activation."""
        return self._begin(request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> RunT:
        """Begin a later activation, as `start` does."""
        return self._begin(request, signal)

    def _begin(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> RunT:
        raise NotImplementedError
