"""Real children (issue 16, SPEC §10): what the adapters add on top of the raw SDKs.

- Model call: `OpenAIChatModel.complete` against a raw ``openai`` client call
  (``chat.completions.create``, reading the reply) on the same loopback Chat Completions
  server, streaming and not, interleaved. Goal: ≤ 1.2× (p50).
- ACP start: `AcpProvider.start` (spawn → ``initialize`` → ``session/new`` → the
  ``session/prompt`` on its way) against the same steps written directly with the
  ``agent-client-protocol`` package on an event loop the caller already runs. Goal: ≤ 1.2×.

Both servers are the test suite's: `tests.providers.openai_server` and
`tests/providers/acp_agent.py`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._report import Section, table
from benchmarks._stats import Spread, fmt_ratio, fmt_s, percentile, sample_interleaved, spread
from controlplane import (
    CancelSignal,
    Descriptor,
    MessageSource,
    StartRequest,
    TextBlock,
)
from controlplane.contract import AgentRegistry
from controlplane.models import (
    ChatMessage,
    ModelRequest,
)

__all__ = ["ChildrenConfig", "run_children"]

_GOAL = 1.2
_AGENT = Path(__file__).resolve().parents[1] / "tests" / "providers" / "acp_agent.py"
_REPLY = "Sea otters hold hands while they sleep, so that they do not drift apart."


@dataclass(frozen=True)
class ChildrenConfig:
    """How much to measure."""

    rounds: int = 7
    calls: int = 200
    acp_rounds: int = 5
    acp_starts: int = 10

    @classmethod
    def quick(cls) -> ChildrenConfig:
        """A smoke run: small, seconds."""
        return cls(rounds=2, calls=20, acp_rounds=1, acp_starts=2)


def run_children(config: ChildrenConfig) -> Section | None:
    """Measure both figures; None when the ``openai`` or ``acp`` extra is missing."""
    try:
        import acp  # noqa: F401
        import openai  # noqa: F401
    except ImportError:
        return None
    model_rows = _model_calls(config)
    acp_row = _acp_starts(config)
    return Section("Real children", _body(config, model_rows, acp_row), {})


def _model_calls(config: ChildrenConfig) -> dict[str, tuple[Spread, Spread, Spread]]:
    import openai

    from controlplane.models import OpenAIChatModel
    from tests.providers.openai_server import ChatServer

    request = ModelRequest(
        system="Answer briefly.", messages=[ChatMessage(role="user", text="tell me about otters")]
    )
    raw_messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "tell me about otters"},
    ]
    rows: dict[str, tuple[Spread, Spread, Spread]] = {}
    with ChatServer() as server:
        server.script(*[{"text": _REPLY}] * (4 * config.rounds * config.calls + 2))
        client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        ours = {
            stream: OpenAIChatModel("bench", base_url=server.base_url, stream=stream)
            for stream in (True, False)
        }
        signal = CancelSignal()

        def raw_stream() -> str:
            stream = client.chat.completions.create(
                model="bench", messages=raw_messages, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        def raw_plain() -> str:
            reply = client.chat.completions.create(model="bench", messages=raw_messages)
            return reply.choices[0].message.content or ""

        ops = {
            "ours_stream": lambda: ours[True].complete(request, signal),
            "raw_stream": raw_stream,
            "ours_plain": lambda: ours[False].complete(request, signal),
            "raw_plain": raw_plain,
        }
        assert raw_stream() == ours[True].complete(request, signal).text == _REPLY
        per_round: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(config.rounds):
            samples = sample_interleaved(ops, config.calls)
            for name, values in samples.items():
                per_round[name].append(percentile(values, 50))
    for mode in ("stream", "plain"):
        ours_p50, raw_p50 = per_round[f"ours_{mode}"], per_round[f"raw_{mode}"]
        ratio = spread([o / r for o, r in zip(ours_p50, raw_p50, strict=True)])
        rows[mode] = (spread(ours_p50), spread(raw_p50), ratio)
    return rows


def _acp_starts(config: ChildrenConfig) -> tuple[Spread, Spread, Spread]:
    from controlplane import AcpProvider

    state = Path(tempfile.mkdtemp(prefix="subagent-bench-acp-"))
    command = [sys.executable, str(_AGENT), "--state", str(state)]
    provider = AcpProvider(command, grace_s=2.0)
    registry = AgentRegistry()
    parent = registry.register("bench-parent")
    loop = asyncio.new_event_loop()
    ours_p50: list[float] = []
    raw_p50: list[float] = []
    try:
        for _ in range(config.acp_rounds):
            ours: list[float] = []
            raw: list[float] = []
            for _ in range(config.acp_starts):
                ours.append(_one_start(provider, parent, registry))
                raw.append(loop.run_until_complete(_raw_start(command)))
            ours_p50.append(percentile(ours, 50))
            raw_p50.append(percentile(raw, 50))
    finally:
        loop.close()
    ratio = spread([o / r for o, r in zip(ours_p50, raw_p50, strict=True)])
    return spread(ours_p50), spread(raw_p50), ratio


class _Discard:
    """A transcript writer that keeps nothing (the benchmark times the protocol)."""

    turn = 1

    def append(
        self, kind: str, data: Any, *, source: MessageSource | None = None, last: bool = False
    ) -> None:
        pass


def _one_start(provider: Any, parent: Any, registry: AgentRegistry) -> float:
    import uuid

    request = StartRequest(
        child_id=str(uuid.uuid4()),
        prompt=[TextBlock(text="hello")],
        source=MessageSource(kind="user"),
        parent=parent,
        descriptor=Descriptor.build(provider="acp"),
        depth=1,
        transcript=_Discard(),
    )
    t0 = time.perf_counter()
    run = provider.start(request, CancelSignal())
    took = time.perf_counter() - t0
    run.result()
    run.dispose()
    return took


class _RawClient:
    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def _raw_start(command: list[str]) -> float:
    import acp

    t0 = time.perf_counter()
    client: Any = _RawClient()
    async with acp.spawn_agent_process(client, *command) as (conn, _process):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(Path.cwd()), mcp_servers=[])
        took = time.perf_counter() - t0
        await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("hello")])
    return took


def _verdict(ratio: Spread) -> str:
    return "met" if ratio.median <= _GOAL else "**not met**"


def _body(
    config: ChildrenConfig,
    model_rows: dict[str, tuple[Spread, Spread, Spread]],
    acp_row: tuple[Spread, Spread, Spread],
) -> str:
    model_table = table(
        ["mode", "`OpenAIChatModel.complete` p50", "raw `openai` p50", "ratio", "goal ≤ 1.2×"],
        [
            [mode, fmt_s(o), fmt_s(r), fmt_ratio(x), _verdict(x)]
            for mode, (o, r, x) in (
                ("streaming", model_rows["stream"]),
                ("not streaming", model_rows["plain"]),
            )
        ],
    )
    ours, raw, ratio = acp_row
    acp_table = table(
        ["`AcpProvider.start` p50", "raw `agent-client-protocol` p50", "ratio", "goal ≤ 1.2×"],
        [[fmt_s(ours), fmt_s(raw), fmt_ratio(ratio), _verdict(ratio)]],
    )
    return f"""\
**Model call overhead.** One Chat Completions call (a system and a user message; a
72-character reply, streamed in 3-character chunks or sent whole) to the test suite's
loopback server (`http.server` in a thread), through `OpenAIChatModel.complete` and
through a raw `openai.OpenAI` client reading the same reply, {config.rounds} rounds of
{config.calls} calls each, interleaved in turns of 20. The adapter adds the request
conversion, one hop to a pooled worker thread and back (so that a kill can end the call at
once), and the tenacity retry wrapper:

{model_table}

**ACP start.** Spawning the test agent (a Python process), `initialize`, `session/new`,
until the `session/prompt` is on its way: `AcpProvider.start` (its own thread and event
loop per activation, the session id written through the transcript writer) against the
same steps written with `acp.spawn_agent_process` on an event loop the caller already
runs; {config.acp_rounds} rounds of {config.acp_starts} starts each side, the process
reaped after each. Interpreter start-up of the agent dominates both:

{acp_table}
"""
