"""The model-call path of a live activation, timed mode by mode (issue 26: "recording
usage and checking the budget adds ≤ 5% to the model-call append it rides with").

A provider of the benchmark's own (`_Capture`) keeps each activation's real transcript
writer and spend gate from its `StartRequest`; once the child is published (a steer was
taken), the benchmark thread does what the agent loop does around a model call:
``gate.check(MODEL_CALL)`` then ``transcript.append("assistant/message", data)``, with
``data`` as the loop writes it. One child per mode, one control plane per backend, the
modes taking turns call by call (`sample_interleaved`, chunk 1):

- ``bare``: the append of a reply without usage and no gate asked: the model-call append
  as it was before usage and budgets (the baseline);
- ``bare again``: the same on a second child: the A/A noise floor;
- ``recorded``: the reply with its usage, no gate asked: what recording usage alone adds
  to the append;
- ``usage``: the gate asked (no budget on any scope), the reply with its usage, which the
  store counts in the ledger for the child and its session in the append's transaction;
- ``budget``: as ``usage``, the child with a budget none of its calls reaches;
- ``priced``: as ``budget``, the child's model priced (the call's cost computed before the
  write, and a cost limit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks._provider import PROVIDER_NAME, BenchProvider, BenchRun
from benchmarks._stats import percentile, sample_interleaved
from controlplane import (
    Budget,
    CancelSignal,
    ContinuableStartSpec,
    EventKind,
    MessageSource,
    Price,
    StartRequest,
    SubagentControl,
    TextBlock,
    TranscriptWriter,
    Usage,
)
from controlplane.contract import MODEL_CALL, usage_data

__all__ = ["APPEND_MODES", "AppendSamples", "time_appends"]

APPEND_MODES = ("bare", "bare again", "recorded", "usage", "budget", "priced")
_PARENT = "bench-spend-appends"
_MODEL = "bench-model"
_PRICED = "bench-priced-model"
_PRICES = {_PRICED: Price(input=3.0, output=15.0, cached_input=0.3)}
_ROOMY = Budget(tokens=10**15, model_calls=10**12, tool_calls=10**12, seconds=10**9)
_ROOMY_COST = Budget(tokens=10**15, cost=10.0**12, model_calls=10**12, seconds=10**9)
_REPLY = "Checked the migration: seq stays gapless; the index covers (child_id, seq)."
_REPORTED = Usage(input_tokens=1_800, output_tokens=120, cached_input_tokens=1_024)
_WITHOUT = {"text": _REPLY, "steering_seen": 0}
_WITH = {**_WITHOUT, **usage_data(_REPORTED, counted=Usage(model_calls=1))}
_WAIT_S = 30.0


@dataclass
class AppendSamples:
    """Per round, each mode's p50 (seconds) of one model call's gate and append."""

    p50: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in APPEND_MODES})


class _Capture(BenchProvider):
    """`BenchProvider` that keeps each started child's transcript writer and gate."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, StartRequest] = {}
        self._seen = threading.Condition()

    def start(self, request: StartRequest, signal: CancelSignal) -> BenchRun:
        run = super().start(request, signal)
        with self._seen:
            self.requests[request.child_id] = request
            self._seen.notify_all()
        return run

    def request_of(self, child_id: str) -> StartRequest:
        with self._seen:
            if not self._seen.wait_for(lambda: child_id in self.requests, _WAIT_S):
                raise TimeoutError(f"provider.start was not called for {child_id}")
            return self.requests[child_id]


def time_appends(url: str, rounds: int, ops: int) -> AppendSamples:
    """Open a control plane on ``url`` and time every mode, ``rounds`` × ``ops`` calls."""
    control = SubagentControl.open(url, prices=_PRICES)
    provider = _Capture()
    control.providers.register(provider)
    parent = control.agents.register(_PARENT)
    out = AppendSamples()
    try:
        calls: dict[str, Callable[[], None]] = {}
        for mode in APPEND_MODES:
            budget = {"budget": _ROOMY, "priced": _ROOMY_COST}.get(mode)
            model = _PRICED if mode == "priced" else _MODEL
            spec = ContinuableStartSpec(
                provider=PROVIDER_NAME, label=mode, prompt=[TextBlock(text="go")],
                parent=parent, agent_model=model, budget=budget,
            )  # fmt: skip
            child_id = control.start_continuable(spec).child_id
            steered = control.send_message(
                parent,
                child_id,
                [TextBlock(text="published?")],
                MessageSource(kind="coordinator", sender_session_id=_PARENT),
            )
            if steered.route != "steered":
                raise AssertionError(f"{mode}: expected a live, published child")
            request = provider.request_of(child_id)
            calls[mode] = _model_call(request.transcript, request.gate, mode)
            calls[mode]()  # the first write of each (its scopes' rows): not timed
        for _ in range(rounds):
            for mode, timed in sample_interleaved(calls, ops, chunk=1).items():
                out.p50[mode].append(percentile(timed, 50))
    finally:
        provider.release_all()
        control.close()
    return out


def _model_call(transcript: TranscriptWriter, gate: Any, mode: str) -> Callable[[], None]:
    """What the agent loop does around one model call, in ``mode``."""
    if mode.startswith("bare"):
        return lambda: transcript.append(EventKind.ASSISTANT_MESSAGE, _WITHOUT)
    if mode == "recorded":
        return lambda: transcript.append(EventKind.ASSISTANT_MESSAGE, _WITH)
    if gate is None:
        raise AssertionError("a control plane on a store gives every run a gate")

    def call() -> None:
        gate.check(MODEL_CALL)
        transcript.append(EventKind.ASSISTANT_MESSAGE, _WITH)

    return call
