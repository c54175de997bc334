"""Runtime A of the two-process trace test: holds a child whose turn waits in a model
call, with its spans exported to memory, and prints them once the Task settled.

Usage: ``trace_holder.py URL``. Prints ``running <child_id> <task_id>``, then, once the
Task settled (runtime B kills it), ``settled <status>``, one ``span <json>`` line per
exported span, and ``end``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane import (
    ContinuableStartSpec,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)

WAIT_S = 30.0


def _span(s: Any) -> str:
    """An SDK ``ReadableSpan`` as one JSON line."""
    return json.dumps(
        {
            "name": s.name,
            "trace_id": format(s.context.trace_id, "032x"),
            "span_id": format(s.context.span_id, "016x"),
            "parent_id": format(s.parent.span_id, "016x") if s.parent else None,
            "links": [format(link.context.span_id, "016x") for link in s.links],
            "attributes": dict(s.attributes or {}),
            "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in s.events],
        }
    )


def main(url: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel(["never answered"], gated=True)  # a kill ends the call
    with SubagentControl.open(url, tracer_provider=tracer_provider) as control:
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register(
            "trace-parent", model=ModelSelector(provider="acme", model="m1")
        )
        spec = ContinuableStartSpec(
            provider="inprocess", label="otters", prompt=[TextBlock(text="go")], parent=parent
        )
        started = control.start_continuable(spec)
        if not model.wait_for_calls(1, WAIT_S):
            raise SystemExit("the model was never called")
        print(f"running {started.child_id} {started.task_id}", flush=True)
        snapshot = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        print(f"settled {snapshot.status.value}", flush=True)
    for span in exporter.get_finished_spans():
        print(f"span {_span(span)}", flush=True)
    print("end", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
