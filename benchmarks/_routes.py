"""The two routes a message takes, timed the same way by every section that measures them.

A `Plane` is a control plane with the benchmarks' `BenchProvider` and one registered parent.
Its `steer` is a round trip into a running child (it must come back ``steered``); its
`resume` sends to an idle child and reports when ``provider.resume`` was called with the
rebuilt child — where a resume's latency stops — and when the Task had settled and its
activation was gone (the turn ends as soon as the run is released).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._harness import PARENT_SESSION
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    MessageSource,
    ResumeRequest,
    SubagentControl,
    TextBlock,
)

__all__ = ["MESSAGE", "SOURCE", "TEXT", "Plane", "Resumed"]

TEXT = "Also check the migration for the events table; keep seq gapless."
MESSAGE = [TextBlock(text=TEXT)]
SOURCE = MessageSource(kind="coordinator", sender_session_id=PARENT_SESSION)


@dataclass(frozen=True, slots=True)
class Resumed:
    """One timed resume."""

    to_provider_s: float
    """``send_message`` → ``provider.resume`` called."""
    to_settled_s: float
    """``send_message`` → ``tasks.wait`` returned: the turn ended, the Task settled."""
    request: ResumeRequest


@dataclass
class Plane:
    """A control plane, its bench provider and its parent."""

    control: SubagentControl
    provider: BenchProvider
    parent: AgentHandle

    @classmethod
    def open(cls, url: str, **options: Any) -> Plane:
        """`SubagentControl.open` with the bench provider and `PARENT_SESSION` registered."""
        control = SubagentControl.open(url, **options)
        try:
            provider = BenchProvider()
            control.providers.register(provider)
            return cls(control, provider, control.agents.register(PARENT_SESSION))
        except BaseException:
            control.close()
            raise

    def close(self) -> None:
        """Let every run end, then close the control plane."""
        self.provider.release_all()
        self.control.close()

    def steer(self, child_id: str) -> None:
        """One steer round trip into a running child."""
        result = self.control.send_message(self.parent, child_id, MESSAGE, SOURCE)
        if result.route != "steered":
            raise AssertionError(f"expected a steer, got {result}")

    def resume(
        self,
        child_id: str,
        message: Sequence[TextBlock] = MESSAGE,
        source: MessageSource | None = SOURCE,
    ) -> Resumed:
        """Send to an idle child; time it until ``provider.resume``, then until settled."""
        t0 = time.perf_counter()
        result = self.control.send_message(self.parent, child_id, message, source)
        called, run, request = self.provider.wait_resumed(child_id)
        run.release()
        self.control.tasks.wait(result.task_id, timeout=60.0, requester=self.parent)
        return Resumed(called - t0, time.perf_counter() - t0, request)

    def grow(self, live: list[str], level: int) -> None:
        """Start children until ``level`` are live and published (one steer each)."""
        started: list[str] = []
        while len(live) + len(started) < level:
            spec = ContinuableStartSpec(
                provider=PROVIDER_NAME,
                label="bench",
                prompt=[TextBlock(text="go")],
                parent=self.parent,
            )
            started.append(self.control.start_continuable(spec).child_id)
        for child_id in started:
            self.steer(child_id)  # returns once published and delivered
        live.extend(started)
