"""What one turn looks like in OpenTelemetry: a tool call, a steer from another thread, a kill.

Run it with:  python examples/observe.py

It needs the OpenTelemetry SDK (`pip install 'subagent-control[otel]' opentelemetry-sdk`).
Spans go to the console, one line each as they end, or to an OTLP collector when
OTEL_EXPORTER_OTLP_ENDPOINT is set and `opentelemetry-exporter-otlp-proto-http` is
installed; the output says which. At the end the turn's trace is drawn as a tree. The
"model" is a scripted stand-in that asks for one tool call, then waits until it is killed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControl,
    TextBlock,
    Usage,
)
from controlplane.models import ModelReply, ToolCall

OTLP = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def _one_line(span: Any) -> str:
    parent = f"{span.parent.span_id:016x}" if span.parent else "-" * 16
    return f"span {span.context.span_id:016x} parent {parent}  {span.name}\n"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _exporters() -> tuple[Any, Any, str]:
    """The exporter the spans go to, an in-memory one for the tree, and where they go."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint and _importable(OTLP):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(), InMemorySpanExporter(), f"OTLP ({endpoint})"
    where = "the console"
    if endpoint:
        where += " (OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OTLP exporter is not installed)"
    return ConsoleSpanExporter(formatter=_one_line), InMemorySpanExporter(), where


def _draw(spans: list[Any], trace_id: int) -> None:
    """The trace ``trace_id`` as an indented tree, each span with its links."""
    mine = sorted((s for s in spans if s.context.trace_id == trace_id), key=lambda s: s.start_time)
    children: dict[int | None, list[Any]] = {}
    for span in mine:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)
    names = {s.context.span_id: s.name for s in spans}

    def draw(span: Any, depth: int) -> None:
        extra = [f"{k}={v}" for k, v in (span.attributes or {}).items() if k == "error.type"]
        extra += [f"steered by {names.get(int(e.attributes['subagent.send.span_id'], 16), '?')}"
                  for e in span.events if e.name == "subagent.steered"]  # fmt: skip
        print(f"{'  ' * depth}{span.name}" + (f"  ({', '.join(extra)})" if extra else ""))
        for child in children.get(span.context.span_id, []):
            draw(child, depth + 1)

    for root in children.get(None, []):
        draw(root, 0)


def main() -> int:
    if not _importable("opentelemetry.sdk"):
        needed = "pip install 'subagent-control[otel]' opentelemetry-sdk"
        print(f"this example needs the OpenTelemetry SDK: {needed}", file=sys.stderr)
        return 2
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter, memory, where = _exporters()
    print(f"exporting spans to {where}")
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
    harness = tracer_provider.get_tracer("harness")

    looked_up = threading.Event()

    def lookup(arguments: dict[str, Any]) -> str:
        with harness.start_as_current_span("lookup (the tool's own span)"):
            looked_up.set()
            return f"{arguments['word']}: a semi-aquatic mammal"

    call = ToolCall(id="c1", name="lookup", arguments={"word": "otter"})
    model = ScriptedModel(
        [ModelReply(tool_calls=[call], usage=Usage(input_tokens=42, output_tokens=7)), "done"],
        gated=True,  # each call waits for `release`: the second one until the kill
    )
    tools = [ChildTool("lookup", "Look a word up.", {"type": "object"}, lookup)]
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{Path(scratch) / 'observe.db'}"
        with SubagentControl.open(url, tracer_provider=tracer_provider) as control:
            control.providers.register(InProcessProvider(model, tools=tools))
            parent = control.agents.register(
                "parent-1", model=ModelSelector(provider="demo", model="scripted-1")
            )
            with harness.start_as_current_span("parent tool call: subagent") as turn:
                spec = ContinuableStartSpec(
                    provider="inprocess", label="otters", parent=parent,
                    prompt=[TextBlock(text="what is an otter?")],
                )  # fmt: skip
                started = control.start_continuable(spec)
                model.release()  # the first call asks for the tool
                if not (looked_up.wait(10) and model.wait_for_calls(2, 10)):
                    print("the child never reached its second model call", file=sys.stderr)
                    return 1

                def steer() -> None:
                    text = [TextBlock(text="sea otters only")]
                    sent = control.send_message(parent, started.child_id, text)
                    print(f"steer from another thread: route={sent.route}")

                steering = threading.Thread(target=steer, name="human")
                steering.start()
                steering.join(10)
                control.tasks.kill(started.task_id, requester=parent)
            done = control.tasks.wait(started.task_id, timeout=10, requester=parent)
            print(f"task {done.status.value}")
    tracer_provider.shutdown()
    print("\none turn's trace (the steer's send is a trace of its own, linked to it):")
    _draw(list(memory.get_finished_spans()), turn.get_span_context().trace_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
