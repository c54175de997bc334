"""The A2A front (issue 28): what serving a start and a steer over A2A costs beside calling
the Python API directly, ratios measured in the same run.

One control plane (SQLite, and PostgreSQL when reachable) with the bench provider (its
runs block, so children stay live), served by `A2AServer` on a loopback port in this
process; a keep-alive `httpx` client posts hand-built JSON-RPC (``SendMessage`` with
``returnImmediately``, as a client that does not want to wait for the turn sends it). Per
round, interleaved call by call:

- start: ``start_continuable`` against a ``SendMessage`` without a context, and the same
  to a second server whose provider holds each start until the answer is in (so the new
  activation's publication does not run beside the request: what is left is the front's
  own cost);
- steer, on a pool of live children: ``send_message`` against a ``SendMessage`` naming
  the Task (``taskId``: a Task running here is read in memory and steered from the
  server's loop) and one naming only the context (``contextId``: the server reads the
  child's stored parent once and remembers it, as a child's parent never changes);
- the HTTP round trip alone: ``GET`` of the agent card through the same server and guard.

The started children are released and settled between rounds (each holds threads).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks._harness import frozen_gc, pg_schema, sqlite_url
from benchmarks._provider import PROVIDER_NAME, BenchProvider, HeldStartProvider
from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, percentile, sample_interleaved, spread
from controlplane import ContinuableStartSpec, SubagentControl, TextBlock

__all__ = ["A2AConfig", "run_a2a"]

_PARENT = "bench-a2a"
_TEXT = "Also check the migration for the events table; keep seq gapless."
_HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}
_CARD = ".well-known/agent-card.json"
_WAIT_S = 60.0
_STARTS = ("start: Python API", "start: A2A", "start: A2A, publication held")
_STEERS = ("steer: Python API", "steer: A2A, taskId", "steer: A2A, contextId", "HTTP round trip")


@dataclass(frozen=True)
class A2AConfig:
    """How much to measure."""

    rounds: int = 5
    starts: int = 40
    steers: int = 300
    live: int = 20

    @classmethod
    def quick(cls) -> A2AConfig:
        """A smoke run: small, seconds."""
        return cls(rounds=2, starts=5, steers=20, live=4)


def run_a2a(config: A2AConfig, workdir: Path, pg_url: str | None = None) -> Section | None:
    """Measure starts and steers through the A2A front and directly, on SQLite and, when
    ``pg_url`` is given, on PostgreSQL."""
    try:
        from controlplane.fronts._a2a import A2AServer  # noqa: F401 (the extra is there)
    except ImportError:  # the a2a extra is not installed
        return None
    parts: list[str] = []
    figures: dict[str, float] = {}
    backends: list[tuple[str, Callable[[], Any]]] = [
        ("SQLite", lambda: nullcontext(sqlite_url(workdir / "a2a.db")))
    ]
    if pg_url is not None:
        backends.append(("PostgreSQL", lambda: pg_schema(pg_url)))
    for backend, url_of in backends:
        with url_of() as url:
            p50, tasks = _measure(config, url)
        parts.append(_body(config, p50, tasks, backend))
        for name in (*_STEERS[1:3], _STARTS[1]):
            figures[f"a2a {backend}: {name} / API"] = _ratio(p50, name).median
            figures[f"a2a {backend}: {name} beyond round trip / API"] = _beyond(p50, name).median
    return Section("A2A front", _head(config) + "\n\n".join(parts) + _READING, {"figures": figures})


def _measure(config: A2AConfig, url: str) -> tuple[dict[str, list[float]], int]:
    from controlplane.fronts._a2a import A2AServer

    p50: dict[str, list[float]] = {name: [] for name in (*_STARTS, *_STEERS)}
    control = SubagentControl.open(url)
    provider, held = BenchProvider(), HeldStartProvider()
    control.providers.register(provider)
    control.providers.register(held)
    parent = control.agents.register(_PARENT)
    server = A2AServer(control, parent, provider=PROVIDER_NAME).start()
    held_server = A2AServer(control, parent, provider=held.name).start()
    try:
        with (
            httpx.Client(base_url=server.url, headers=_HEADERS, timeout=_WAIT_S) as http,
            httpx.Client(base_url=held_server.url, headers=_HEADERS, timeout=_WAIT_S) as slow,
        ):
            bench = _Bench(control, provider, parent, http, (held, slow))
            pool = bench.live_pool(config.live)
            with frozen_gc():
                for _ in range(config.rounds):
                    timed = sample_interleaved(bench.starts(), config.starts, chunk=1)
                    timed |= sample_interleaved(bench.steers(pool), config.steers, chunk=1)
                    for name, samples in timed.items():
                        p50[name].append(percentile(samples, 50))
                    bench.settle_started()
            tasks = len(control.tasks.list(parent))
    finally:
        server.stop()
        held_server.stop()
        for run in [*provider.runs.values(), *held.runs.values()]:
            run.release()
        control.close()
    return p50, tasks


class _Bench:
    def __init__(
        self,
        control: SubagentControl,
        provider: BenchProvider,
        parent: object,
        http: httpx.Client,
        held: tuple[HeldStartProvider, httpx.Client],
    ) -> None:
        self._control = control
        self._provider = provider
        self._parent = parent
        self._http = http
        self._held, self._held_http = held
        self._started: list[str] = []
        self._rng = random.Random(28)

    def live_pool(self, count: int) -> list[tuple[str, str]]:
        """``count`` live children, published: (child id, Task id) each."""
        pool = []
        for _ in range(count):
            start = self._control.start_continuable(self._spec())
            self._control.send_message(self._parent, start.child_id, [TextBlock(text="ready?")])  # type: ignore[arg-type]
            pool.append((start.child_id, start.task_id))
        return pool

    def starts(self) -> dict[str, Callable[[], object]]:
        def direct() -> None:
            self._started.append(self._control.start_continuable(self._spec()).task_id)

        def over_a2a() -> None:
            self._started.append(self._rpc(_send(_TEXT))["result"]["task"]["id"])

        def publication_held() -> None:
            reply = self._rpc(_send(_TEXT), self._held_http)
            self._held.let_one_start()  # answered: now it may publish
            self._started.append(reply["result"]["task"]["id"])

        return dict(zip(_STARTS, (direct, over_a2a, publication_held), strict=True))

    def steers(self, pool: list[tuple[str, str]]) -> dict[str, Callable[[], object]]:
        message = [TextBlock(text=_TEXT)]

        def direct() -> None:
            child_id, _task_id = self._rng.choice(pool)
            self._control.send_message(self._parent, child_id, message)  # type: ignore[arg-type]

        def by_task() -> None:
            child_id, task_id = self._rng.choice(pool)
            self._rpc(_send(_TEXT, context_id=child_id, task_id=task_id))

        def by_context() -> None:
            child_id, _task_id = self._rng.choice(pool)
            self._rpc(_send(_TEXT, context_id=child_id))

        def round_trip() -> None:
            self._http.get(_CARD).raise_for_status()

        return dict(zip(_STEERS, (direct, by_task, by_context, round_trip), strict=True))

    def settle_started(self) -> None:
        """End and settle the children started this round (their threads go): a kill, as a
        held start's run may not exist yet."""
        for task_id in self._started:
            self._control.tasks.kill(task_id, requester=self._parent)  # type: ignore[arg-type]
        for task_id in self._started:
            self._control.tasks.wait(task_id, _WAIT_S, requester=self._parent)  # type: ignore[arg-type]
        self._started.clear()

    def _spec(self) -> ContinuableStartSpec:
        return ContinuableStartSpec(
            provider=PROVIDER_NAME,
            label="bench",
            prompt=[TextBlock(text=_TEXT)],
            parent=self._parent,  # type: ignore[arg-type]
        )

    def _rpc(self, body: bytes, http: httpx.Client | None = None) -> dict[str, Any]:
        answer = (http or self._http).post("", content=body)
        answer.raise_for_status()
        reply: dict[str, Any] = answer.json()
        if "result" not in reply:
            raise AssertionError(f"A2A refused: {reply}")
        return reply


def _send(text: str, *, context_id: str = "", task_id: str = "") -> bytes:
    message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text}]}
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    params = {"message": message, "configuration": {"returnImmediately": True}}
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params})


def _base(name: str) -> str:
    return _STARTS[0] if name.startswith("start") else _STEERS[0]


def _ratio(p50: dict[str, list[float]], name: str) -> Spread:
    base = p50[_base(name)]
    return spread([v / b for v, b in zip(p50[name], base, strict=True)])


def _beyond(p50: dict[str, list[float]], name: str) -> Spread:
    pairs = zip(p50[name], p50[_STEERS[-1]], p50[_base(name)], strict=True)
    return spread([(v - t) / b for v, t, b in pairs])


def _head(config: A2AConfig) -> str:
    return f"""\
The server in this process on a loopback port, a keep-alive `httpx` client posting
JSON-RPC `SendMessage` with `returnImmediately`; {config.rounds} rounds of
{config.starts} starts and {config.steers} steers per path, interleaved call by call,
over {config.live} live children. p50 per round: median (min–max) across rounds; ratios
taken inside each round.

"""


def _body(config: A2AConfig, p50: dict[str, list[float]], tasks: int, backend: str) -> str:
    rows = []
    for name in (*_STARTS, *_STEERS):
        shown = "—" if name == _base(name) else fmt_ratio(_ratio(p50, name))
        over = fmt_ratio(_beyond(p50, name)) if "A2A" in name else "—"
        rows.append([name, fmt_s(spread(p50[name])), shown, over])
    columns = ["path", "p50", "vs the Python API", "(path − round trip) / API (goal ≤ 1.5×)"]
    return f"""\
### {backend}

The parent held {tasks} Tasks at the end.

{table(columns, rows)}
"""


_READING = """
The A2A paths add the HTTP round trip (the agent card's `GET` above: the server, the
guard and the client) and the SDK's JSON-RPC and protobuf decoding and encoding. A steer
of a Task running here is sent from the server's loop (`controlplane.runtime._asend`: the
supervisor's answer is awaited without a worker thread, the commit alone runs in one) and
answered from the Task's in-memory snapshot; a start is one worker-thread hop, its Task
read included. A start's activation begins at once in this process and publishes its run
while the answer is on its way, and the request's threads wait for the GIL behind it: the
held row is the same start with the provider's start, and so the publication, held until
the answer is in. A steer naming only the context reads the child's stored parent once
per child and server, then remembers it (a child's parent never changes).
"""
