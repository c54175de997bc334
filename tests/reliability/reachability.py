"""The stress runs' "0 wedged children" probe (issue 36): every child reachable within
lease + 1 s after a fault heals.

A `Reachability` is a runtime of its own (none of the workers: never the holder of a
child when a fault heals), opened on a link no fault touches. `probe` is called by a fault
schedule right after each fault heals: it sends to every child at once, one thread per
child, and a child is reachable once a send is delivered (``steered`` into its running
turn, or ``started`` a turn here). A refusal (``NOT_DELIVERED``, a store or durability
failure on the way back) is sent again, as a caller would, a fresh text each time; every
loop is bounded in count and time. Each child's time from the heal to its delivery is
recorded; one past lease + 1 s, or never delivered within `GIVE_UP_LEASES` leases, is a
wedged child. Every probe send is a `Sent` of its own, so the run's accounting checks it
exactly like the load's (stored once if delivered, never if refused).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from controlplane import MessageSource, SubagentControl, SubagentControlError, TextBlock
from tests.reliability.load import SEED, Sent
from tests.reliability.stepping import Clock
from tests.reliability.stress_child import PARENT, ExclusiveSteppingProvider

NAME = "probe"
"""The first word of every probe text: `Reports.sender_runtime` maps it to this runtime."""
GIVE_UP_LEASES = 4.0
"""A child not reached within this many leases after the heal is reported, not waited for."""
RETRY_S = 0.05
"""Between a refused probe and the next: a caller's retry pace, not a synchronisation."""
SEND_CAP = 400
"""Sends per child per probe at most (the loop's bound in count)."""


class Reachability:
    """The probing runtime and what its probes measured.

    Args:
        url: The store, over a link no fault of the schedule touches.
        lease_ttl_s: The workers' lease (and this runtime's).
        locks: The lock probe's folder (`idle_children`'s ``locks``): an activation started
            here takes part in the double-activation check.
        provider: Its provider's class (one that recovers turns where the run recovers
            them: a runtime that has the children's provider takes dead runtimes' Tasks
            over, and one whose provider cannot carry a turn on settles them).
    """

    def __init__(
        self,
        url: str,
        lease_ttl_s: float,
        locks: Path,
        provider: type[ExclusiveSteppingProvider] = ExclusiveSteppingProvider,
    ) -> None:
        self._lease = lease_ttl_s
        clock = Clock()
        clock.drain()  # a turn started here runs through at once
        self.provider = provider(clock, seed=SEED + 99, locks=locks)
        self.control = SubagentControl.open(url, lease_ttl_s=lease_ttl_s)
        self.control.providers.register(self.provider)
        self._parent = self.control.agents.register(PARENT)
        self._lock = threading.Lock()
        self.sent: list[Sent] = []
        self.reached_s: list[float] = []  # per child per probe: heal -> delivered
        self.wedged: list[str] = []
        self.probes = 0
        self._count = 0

    @property
    def runtime_id(self) -> str:
        return self.control.runtime_id

    def probe(self, children: list[str], healed_at: float, fault: str) -> None:
        """Reach every child, measured from ``healed_at`` (`time.monotonic`)."""
        self.probes += 1
        with ThreadPoolExecutor(len(children), thread_name_prefix="probe") as pool:
            for child_id, (reached, story) in zip(
                children, pool.map(lambda c: self._reach(c, healed_at), children), strict=True
            ):
                if reached is None or reached > self._lease + 1.0:
                    took = "never" if reached is None else f"{reached:.2f}s"
                    tries = ", ".join(story[:10])
                    self.wedged.append(f"{child_id[:8]} after {fault}: reached {took} ({tries})")
                if reached is not None:
                    with self._lock:
                        self.reached_s.append(reached)

    def _reach(self, child_id: str, healed_at: float) -> tuple[float | None, list[str]]:
        """The time from the heal to the child's delivery (None: not within the bound),
        and each send's outcome and duration, for the report of a slow one."""
        deadline = healed_at + self._lease * GIVE_UP_LEASES
        story: list[str] = []
        for _attempt in range(SEND_CAP):
            began = time.monotonic()
            if began >= deadline:
                return None, story
            with self._lock:
                self._count += 1
                text = f"{NAME} {self._count}"
            source = MessageSource(kind="coordinator", sender_session_id=self._parent.session_id)
            sent = Sent(text, child_id, source, "idle")
            with self._lock:
                self.sent.append(sent)
            try:
                result = self.control.send_message(
                    self._parent, child_id, [TextBlock(text=text)], source
                )
            except SubagentControlError as exc:
                sent.code = exc.code
                took = time.monotonic() - began
                story.append(f"{exc.code.value} in {took:.2f}s: {exc.message[:120]}")
                time.sleep(RETRY_S)  # a caller's retry pace
                continue
            sent.route, sent.task_id = result.route, result.task_id
            took = time.monotonic() - began
            story.append(f"{result.route} in {took:.2f}s into task {result.task_id[:8]}")
            return time.monotonic() - healed_at, story
        return None, story

    def figures(self) -> dict[str, Any]:
        refused = sum(1 for sent in self.sent if sent.code is not None)
        return {
            "probes": self.probes,
            "probe_sends": len(self.sent),
            "probe_sends_refused_then_retried": refused,
            "children_reached": len(self.reached_s),
            "max_s_to_reachable": round(max(self.reached_s, default=0.0), 2),
            "wedged_children": len(self.wedged),
            "wedged": self.wedged[:20],
        }

    def close(self) -> None:
        self.control.close(timeout_s=self._lease * 2)
