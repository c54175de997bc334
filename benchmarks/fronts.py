"""Protocol fronts (issue 28), MCP part: what a start and a steer cost through the MCP front
against the Python API, ratios measured in the same run.

Modes, all on one control plane and one store, taking turns chunk by chunk:

- ``api``: ``control.start_continuable`` / ``control.send_message`` (the baseline);
- ``tools``: ``ToolHandlers.acall`` (what every front calls: argument parsing, the
  ownership check of ``send_message``, the answer's text), awaited on the client's loop: a
  steer is sent from the loop (`controlplane.runtime._asend`), a start runs in a worker;
- ``tools in a worker``: ``ToolHandlers.call`` run in the loop's default executor, the
  path every tool call took before the loop's send (the worker-thread hop, measured
  beside it in the same run);
- ``mcp memory``: an ``mcp`` SDK ``Client`` on the front in-process, over the SDK's
  in-memory stream transport (JSON-RPC messages, no sockets);
- ``mcp http``: the same client over streamable HTTP on loopback, to the front served by
  uvicorn (behind the token and body guard) on a thread of this process.

Clients speak the 2025-11-25 handshake era, as today's clients do. The transport's own
round trip is an MCP ``ping`` on each transport, so the front's cost
beyond it is visible: ``(mcp − ping) / api``, goal ≤ 1.5×. Children run on the bench
provider (its runs cost nothing and block until released), so a start and a steer are the
control plane's work and the front's, nothing else. SQLite, and PostgreSQL when reachable.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._fronts_growth import GrowthConfig, measure_growth
from benchmarks._harness import frozen_gc, pg_schema, sqlite_url
from benchmarks._provider import BenchProvider
from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, percentile, spread
from controlplane import ContinuableStartSpec, MessageSource, SubagentControl, TextBlock

__all__ = ["FrontsConfig", "run_fronts"]

_PARENT = "bench-mcp"
_STARTS = "bench-start"
_MESSAGE = "Also check the migration for the events table; keep seq gapless."
_MODES = ("api", "tools", "tools in a worker", "mcp memory", "mcp http")
_WORKER = "tools in a worker"
_WAIT_S = 60.0


@dataclass(frozen=True)
class FrontsConfig:
    """How much to measure."""

    live: int = 20
    rounds: int = 5
    ops: int = 200
    chunk: int = 20
    growth: GrowthConfig = field(default_factory=GrowthConfig)

    @classmethod
    def quick(cls) -> FrontsConfig:
        """A smoke run: seconds."""
        return cls(live=4, rounds=2, ops=20, chunk=10, growth=GrowthConfig.quick())


def run_fronts(config: FrontsConfig, workdir: Path, pg_url: str | None, pg_note: str) -> Section:
    """Measure a start, a steer and a ping per mode, per backend; then a tool steer as the
    session grows (SQLite)."""
    figures: dict[str, dict[str, Spread]] = {}
    backends: list[tuple[str, Callable[[], Any]]] = [
        ("SQLite", lambda: _sqlite(workdir / "fronts.db"))
    ]
    if pg_url is not None:
        backends.append(("PostgreSQL", lambda: pg_schema(pg_url)))
    for backend, url_of in backends:
        with frozen_gc(), url_of() as url:
            figures[backend] = asyncio.run(_measure(config, url))
    growth = measure_growth(config.growth, workdir)
    body = _body(config, figures, pg_url is None and pg_note)
    headline: dict[str, float | Spread] = {}  # ratios as numbers, times as spreads (p50)
    for backend, fig in figures.items():
        for name, value in fig.items():
            if name.startswith("steer") and name.endswith("/api"):
                headline[f"fronts {backend}: {name}"] = value.median
            elif name in ("steer api", "steer tools"):
                headline[f"fronts {backend}: {name}"] = value
    return Section("Protocol fronts", f"{body}\n\n{growth}", {"figures": headline})


@contextmanager
def _sqlite(path: Path) -> Iterator[str]:
    yield sqlite_url(path)


async def _measure(config: FrontsConfig, url: str) -> dict[str, Spread]:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPDeprecationWarning

    from controlplane.fronts import mcp_front
    from controlplane.tools import ToolHandlers

    # `ping` is the handshake era's (2026-07-28 dropped it): the SDK says so on every call.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

    live, starts = BenchProvider(), BenchProvider()
    starts.name = _STARTS  # type: ignore[misc]
    control = SubagentControl.open(url)
    with ExitStack() as stack:
        stack.callback(control.close)
        stack.callback(live.release_all)
        stack.callback(starts.release_all)
        control.providers.register(live)
        control.providers.register(starts)
        # Starts under a session of their own, so the steers' session stays as it is (its
        # size is measured apart: `benchmarks._fronts_growth`).
        parent = control.agents.register(_PARENT)
        starter = control.agents.register(f"{_PARENT}-starts")
        pool = [
            control.start_continuable(_spec(parent, live.name, "live")).child_id
            for _ in range(config.live)
        ]
        source = MessageSource(kind="coordinator", sender_session_id=_PARENT)
        rng = random.Random(28)
        for child_id in pool:  # returns once published: every child steerable from here on
            control.send_message(parent, child_id, [TextBlock(text="warm")], source)
        tools = {
            "start": ToolHandlers(control, starter, provider=_STARTS),
            "steer": ToolHandlers(control, parent, provider=_STARTS),
        }
        fronts = {
            "start": mcp_front(control, starter, provider=_STARTS),
            "steer": mcp_front(control, parent, provider=_STARTS),
        }
        urls = {op: stack.enter_context(_http_server(front)) for op, front in fronts.items()}
        async with AsyncExitStack() as clients_stack:
            clients: dict[tuple[str, str], Any] = {}
            for op, front in fronts.items():
                # The handshake era (2025-11-25), which today's clients speak, has `ping`.
                clients[op, "mcp memory"] = await clients_stack.enter_async_context(
                    Client(front.server, mode="legacy")
                )
                clients[op, "mcp http"] = await clients_stack.enter_async_context(
                    Client(streamable_http_client(urls[op]), mode="legacy")
                )
            started: list[str] = []

            async def start(mode: str) -> None:
                if mode == "api":
                    spec = _spec(starter, _STARTS, "start")
                    started.append(control.start_continuable(spec).task_id)
                    return
                arguments = {"description": "start", "prompt": "go"}
                if mode == "tools":
                    text = (await tools["start"].acall("subagent", arguments)).text
                elif mode == _WORKER:
                    text = (await _in_worker(tools["start"], "subagent", arguments)).text
                else:
                    result = await clients["start", mode].call_tool("subagent", arguments)
                    text = result.content[0].text
                started.append(text.rsplit(" ", 1)[-1])

            async def steer(mode: str) -> None:
                child_id = rng.choice(pool)
                if mode == "api":
                    sent = control.send_message(
                        parent, child_id, [TextBlock(text=_MESSAGE)], source
                    )
                    ok = sent.route == "steered"
                else:
                    arguments = {"subagent_id": child_id, "message": _MESSAGE}
                    if mode == "tools":
                        text = (await tools["steer"].acall("send_message", arguments)).text
                    elif mode == _WORKER:
                        text = (await _in_worker(tools["steer"], "send_message", arguments)).text
                    else:
                        result = await clients["steer", mode].call_tool("send_message", arguments)
                        text = result.content[0].text
                    ok = text.startswith("message delivered")
                if not ok:
                    raise AssertionError(f"expected a steer through {mode}")

            async def ping(mode: str) -> None:
                await clients["steer", mode].send_ping()

            def settle_starts() -> None:
                # Outside the timed calls: end the started turns so live actors stay few
                # (a kill, as a run may not exist yet for a release to reach).
                for task_id in started:
                    control.tasks.kill(task_id, requester=starter)
                for task_id in started:
                    control.tasks.wait(task_id, _WAIT_S, requester=starter)
                started.clear()

            p50: dict[str, list[float]] = {}
            for _ in range(config.rounds):
                rounds = {
                    "start": await _interleaved(start, _MODES, config, after_chunk=settle_starts),
                    "steer": await _interleaved(steer, _MODES, config),
                    "ping": await _interleaved(ping, ("mcp memory", "mcp http"), config),
                }
                for op, timed in rounds.items():
                    for mode, samples in timed.items():
                        p50.setdefault(f"{op} {mode}", []).append(percentile(samples, 50))
    return _summary(p50)


async def _in_worker(tools: Any, name: str, arguments: dict[str, Any]) -> Any:
    """``tools.call`` in the loop's default executor: one worker-thread hop per call."""
    return await asyncio.get_running_loop().run_in_executor(None, tools.call, name, arguments)


async def _interleaved(
    op: Callable[[str], Awaitable[None]],
    modes: tuple[str, ...],
    config: FrontsConfig,
    *,
    after_chunk: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Time ``ops`` calls per mode, in chunks whose order rotates (as `sample_interleaved`)."""
    clock = asyncio.get_running_loop().time
    out: dict[str, list[float]] = {mode: [] for mode in modes}
    for turn in range(-(-config.ops // config.chunk)):
        shift = turn % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            for _ in range(config.chunk):
                t0 = clock()
                await op(mode)
                out[mode].append(clock() - t0)
            if after_chunk is not None:
                after_chunk()
    return out


def _summary(p50: dict[str, list[float]]) -> dict[str, Spread]:
    out = {name: spread(values) for name, values in p50.items()}
    for op in ("start", "steer"):
        api = p50[f"{op} api"]
        for mode in _MODES[1:]:
            mine = p50[f"{op} {mode}"]
            out[f"{op} {mode}/api"] = spread([m / a for m, a in zip(mine, api, strict=True)])
            if mode.startswith("mcp"):
                ping = p50[f"ping {mode}"]
                beyond = [(m - p) / a for m, p, a in zip(mine, ping, api, strict=True)]
                out[f"{op} {mode} beyond transport/api"] = spread(beyond)
                tools = p50[f"{op} tools"]
                over = [(m - p) / t for m, p, t in zip(mine, ping, tools, strict=True)]
                out[f"{op} {mode} beyond transport/tools"] = spread(over)
    return out


def _spec(parent: Any, provider: str, label: str) -> ContinuableStartSpec:
    return ContinuableStartSpec(
        provider=provider, label=label, prompt=[TextBlock(text="go")], parent=parent
    )


@contextmanager
def _http_server(front: Any) -> Iterator[str]:
    """The front served over HTTP on loopback by uvicorn, on a thread with its own loop."""
    import uvicorn

    from controlplane.fronts import Bind
    from controlplane.fronts._mcp_serve import MCP_PATH, http_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    bind = Bind("127.0.0.1", sock.getsockname()[1])
    config = uvicorn.Config(http_app(front, bind, None), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only on the main thread; here it serves quietly.
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="bench-mcp-http"
    )
    thread.start()
    try:
        deadline = 200  # 10 s in 50 ms waits: uvicorn says when it serves by `started`
        pause = threading.Event()
        while not server.started and deadline and thread.is_alive():
            pause.wait(0.05)
            deadline -= 1
        if not server.started:
            raise RuntimeError("the benchmark's MCP HTTP server did not start")
        yield f"http://127.0.0.1:{bind.port}{MCP_PATH}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _body(config: FrontsConfig, figures: dict[str, dict[str, Spread]], pg_note: Any) -> str:
    parts = [__doc__.split("\n\n", 1)[1].strip() if __doc__ else ""]
    parts.append(
        f"{config.live} live children steered at random; {config.ops} calls per mode per "
        f"round, in chunks of {config.chunk}; {config.rounds} rounds. Figures are p50 "
        "(median over rounds, range in brackets)."
    )
    for backend, fig in figures.items():
        rows = []
        for op in ("start", "steer"):
            for mode in _MODES:
                ratio = "—" if mode == "api" else fmt_ratio(fig[f"{op} {mode}/api"])
                beyond_key = f"{op} {mode} beyond transport/api"
                beyond = fmt_ratio(fig[beyond_key]) if beyond_key in fig else "—"
                over_key = f"{op} {mode} beyond transport/tools"
                over = fmt_ratio(fig[over_key]) if over_key in fig else "—"
                ping = fmt_s(fig[f"ping {mode}"]) if f"ping {mode}" in fig else "—"
                rows.append([op, mode, fmt_s(fig[f"{op} {mode}"]), ratio, ping, beyond, over])
        parts.append(f"### {backend}")
        parts.append(
            table(
                [
                    "call",
                    "path",
                    "p50",
                    "path / api",
                    "transport ping p50",
                    "(path − ping) / api (goal ≤ 1.5×)",
                    "(path − ping) / tools",
                ],
                rows,
            )
        )
    parts.append(_READING)
    if pg_note:
        parts.append(f"PostgreSQL: not measured ({pg_note}).")
    return "\n\n".join(parts)


_READING = """\
Reading it: the last column is the MCP front's own cost, over the `ToolHandlers` call it
makes. A tool steer is sent from the loop (`controlplane.runtime._asend`): the loop puts
the message in the child's supervisor's mailbox with an answer future of its own, the
supervisor's thread, answering, hands the steer's commit (a store write, never on the loop)
to a worker, and the worker wakes the loop once the record is durable: three thread
switches where `tools in a worker` (the path every call took before) makes four and the
API's caller two, and no thread waits on the supervisor. A start is one worker-thread call
either way (it writes the store). The MCP front's `tools/call` no longer takes a worker hop
to expand short ids unless an id argument may be a prefix. Profiled on the loop thread, a
`tools/call` beyond a `ping` is the tool call itself plus ~50 function calls of the SDK's
(the request's params and result models): the SDK's handling beyond the transport is small
next to the tool call's thread switches. On SQLite the steer's commit and the switches are
the whole API steer, so the three switches keep `tools` above the API by about one switch
and the front above 1.5×; a PostgreSQL steer's commit dwarfs them. Over HTTP the client,
the uvicorn server and the control plane share one process's GIL, which the ping does not
show.
"""
