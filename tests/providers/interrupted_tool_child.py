"""The interrupted-tool test's child process: a runtime whose child is inside a tool call.

Usage: ``python tests/providers/interrupted_tool_child.py URL RUNS_FILE idempotent|plain``

It starts one child of `PARENT` on an in-process provider whose model calls the tool
`TOOL` (call id `CALL_ID`) at once. The tool's handler appends one line to ``RUNS_FILE``
(so the test counts its runs across processes) and then waits on its signal, which nothing
here aborts: it runs until the process is killed. Once the handler runs, the run is
published and the ``tool/call`` event is in the store, it prints one line
``READY <child_id> <task_id>`` and waits to be killed (SIGKILL). A watchdog ends it after
`WATCHDOG_S` regardless, so a test that dies cannot leave it behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)
from controlplane.models import ModelReply, ToolCall
from tests.support import wait_published

PARENT = "toolcrash-parent"
TOOL = "fetch"
CALL_ID = "call-fetch-1"
ARGUMENTS = {"url": "https://example.invalid/report"}
PROMPT = "fetch the report"
WATCHDOG_S = 60.0
WAIT_S = 20.0


def record_run(runs_file: Path, where: str) -> None:
    """Append one line to ``runs_file``: one run of the tool's handler."""
    with runs_file.open("a", encoding="utf-8") as out:
        out.write(f"{where} {os.getpid()}\n")


def fetch_tool(handler: Any, *, idempotent: bool) -> ChildTool:
    """The tool, with ``handler``; the same definition in the child and in the test."""
    schema = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
    return ChildTool(TOOL, "Fetch a URL.", schema, handler, idempotent=idempotent)


def main(url: str, runs_file: Path, idempotent: bool) -> None:
    threading.Timer(WATCHDOG_S, os._exit, args=(3,)).start()
    entered = threading.Event()

    def blocking(arguments: dict[str, Any], signal: CancelSignal) -> str:
        record_run(runs_file, "killed-process")
        entered.set()
        signal.wait(WATCHDOG_S)  # nothing aborts it: the process dies in here
        return "never returned before the kill"

    call = ToolCall(id=CALL_ID, name=TOOL, arguments=ARGUMENTS)
    model = ScriptedModel([ModelReply(tool_calls=[call]), "unreachable"])
    control = SubagentControl.open(url)
    tools = [fetch_tool(blocking, idempotent=idempotent)]
    control.providers.register(InProcessProvider(model, tools=tools))
    parent = control.agents.register(PARENT)
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess",
            label="fetcher",
            prompt=[TextBlock(text=PROMPT)],
            parent=parent,
        )
    )
    if not entered.wait(WAIT_S):
        raise SystemExit("the tool's handler never ran")
    # Published, so the writes the run held until then (the call among them) are durable.
    wait_published(control, started.child_id)
    assert control.store is not None
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while not any(e.kind == "tool/call" for e in control.store.load(started.child_id).events):
        if time.monotonic() > deadline:
            raise SystemExit("the tool/call event never reached the store")
        pause.wait(0.01)
    print(f"READY {started.child_id} {started.task_id}", flush=True)
    threading.Event().wait(WATCHDOG_S)  # killed before this ends


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "idempotent")
