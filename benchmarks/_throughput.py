"""Messages per second from several threads: our steer, a lock-and-dict router, raw pykka
``tell``, raw appends.

Each side runs ``threads`` threads that start together at a barrier and send
``per_thread`` messages each; the rate is all messages over the wall time until the last
one is done (for ``tell``: until every mailbox has been drained).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pykka

from benchmarks._baselines import EchoActor
from benchmarks._stats import Spread, spread

__all__ = ["Throughput", "ThroughputPlan", "measure_throughput"]

_ECHO_ACTORS = 100


@dataclass(frozen=True, slots=True)
class ThroughputPlan:
    """How many threads, messages per thread, and rounds."""

    threads: int
    per_thread: int
    rounds: int


@dataclass(frozen=True, slots=True)
class Throughput:
    """Messages per second, per side (median of the rounds, with their min–max)."""

    ours: Spread
    router: Spread
    tell: Spread
    append: Spread


def measure_throughput(
    plan: ThroughputPlan,
    *,
    steer: Callable[[str], None],
    route: Callable[[str], None],
    children: list[list[str]],
    append: Callable[[], None],
) -> Throughput:
    """Steer ``children[i]`` (round-robin) from thread ``i``, through us and through the
    router; then the raw sides."""
    actors = [EchoActor.start() for _ in range(_ECHO_ACTORS)]
    total = plan.threads * plan.per_thread
    ours, routed, tell, appends = [], [], [], []
    try:
        for _ in range(plan.rounds):
            ours.append(
                total
                / _in_threads(plan.threads, partial(_steer_many, steer, children, plan.per_thread))
            )
            routed.append(
                total
                / _in_threads(plan.threads, partial(_steer_many, route, children, plan.per_thread))
            )
            tell_many = partial(_tell_many, actors, plan.per_thread)
            tell.append(total / _in_threads(plan.threads, tell_many, after=partial(_drain, actors)))
            appends.append(
                total / _in_threads(plan.threads, partial(_repeat, append, plan.per_thread))
            )
    finally:
        for actor in actors:
            actor.stop()
    return Throughput(spread(ours), spread(routed), spread(tell), spread(appends))


def _steer_many(
    steer: Callable[[str], None], children: list[list[str]], count: int, thread: int
) -> None:
    mine = children[thread]
    for k in range(count):
        steer(mine[k % len(mine)])


def _tell_many(actors: list[pykka.ActorRef[EchoActor]], count: int, thread: int) -> None:
    for k in range(count):
        actors[(thread + k) % len(actors)].tell("ping")


def _repeat(op: Callable[[], None], count: int, _thread: int) -> None:
    for _ in range(count):
        op()


def _drain(actors: list[pykka.ActorRef[EchoActor]]) -> None:
    # Mailboxes are FIFO: once each actor answers an ask, every earlier tell was processed.
    for actor in actors:
        actor.ask("flush")


def _in_threads(
    count: int, body: Callable[[int], None], after: Callable[[], None] | None = None
) -> float:
    """Seconds from a common start until every thread's ``body`` (and ``after``) is done."""
    barrier = threading.Barrier(count + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            body(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    if after is not None:
        after()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed
