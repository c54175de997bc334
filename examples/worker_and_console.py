"""Fronts and consoles in one process, workers with models and tools in others (SPEC §9
"Work goes where the provider is", "Recovery").

Two runtimes share one store. The *worker* has the child's provider (its model and its
``deploy`` tool); the *console* has no provider at all, as a protocol front or an operator's
console would. Run it:

    .venv/bin/python examples/worker_and_console.py [--db sqlite:///state.db]

1. The worker starts a child whose ``deploy`` call needs approval; the run parks (no thread).
2. The console steers the parked child and answers its request: it has no provider, so it
   writes both into the store (``steered`` with the parked Task's id; the answer taken once).
3. The worker continues the same Task from the store: the tool runs once, the model reads
   the console's message, the Task completes. Then the worker closes.
4. With no worker running, the console sends the idle child a follow-up: it has no
   provider, so it answers ``started`` with the message durable, and the Task reads
   ``queued`` (``waiting_for`` the provider); a second message joins that waiting turn
   (``steered``, same Task). The next worker to open runs the turn: its model reads both.
5. That worker closes in the middle of a long turn while another worker is running:
   `close()` hands the turn over, and the other worker, woken by the store, carries the
   same Task on to the end at once (recovered once), with nothing sent by anyone.

In production each runtime is its own process (``SubagentControl.open(url)`` with the same
URL); here they share one process to keep the example self-contained.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ModelRequest, ToolCall

DEPLOY = ModelReply(tool_calls=[ToolCall(id="c1", name="deploy", arguments={"env": "prod"})])


def deploy_tool(runs: list[str]) -> ChildTool:
    def run(arguments: dict[str, str]) -> str:
        runs.append(arguments["env"])
        return f"deployed {arguments['env']}"

    return ChildTool("deploy", "Deploy.", {"type": "object"}, run, approval="always")


class WorkerModel:
    """The later workers' model: it answers at once, except in a turn asked to ``write a
    report``: it calls the ``draft`` tool first, and its call after the draft lasts until
    its run is stopped (the turn in flight when its worker closes) — once."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        said = [m.text for m in request.messages if m.role == "user"]
        if said[-1] == "write a report":
            if request.messages[-1].role == "user":
                return ModelReply(tool_calls=[ToolCall(id="d1", name="draft", arguments={})])
            if not self.entered.is_set():
                self.entered.set()
                signal.wait(60)
                signal.raise_if_aborted()
        return ModelReply(text=f"done ({len(said)} messages read, the last: {said[-2:]})")


DRAFT = ChildTool("draft", "Draft the report.", {"type": "object"}, lambda _args: "drafted")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=f"sqlite:///{tempfile.mkdtemp()}/state.db")
    url = parser.parse_args().db

    runs: list[str] = []
    model = ScriptedModel([DEPLOY, "deployed, and checked the logs"])
    worker = SubagentControl.open(url, approval_grace_s=0.05)
    worker.providers.register(InProcessProvider(model, tools=[deploy_tool(runs)]))
    parent = worker.agents.register("ops")
    start = worker.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="ship", prompt=[TextBlock(text="ship it")], parent=parent
        )
    )
    waiting = worker.tasks.wait(start.task_id, timeout=30, requester=parent)
    assert waiting.status is TaskStatus.INPUT_REQUIRED
    assert waiting.request is not None
    print(f"worker:  task {start.task_id[:8]} asks to run {waiting.request.tool}")

    person = MessageSource(kind="human", sender_session_id="alice")
    with SubagentControl.open(url) as console:  # no providers registered
        operator = console.agents.register("ops")
        message = [TextBlock(text="check the logs too")]
        deadline = time.monotonic() + 10
        while True:  # the run holds the child for its grace period, then parks
            try:
                sent = console.send_message(operator, start.child_id, message, person)
                break
            except SubagentControlError as exc:
                if exc.code is not ErrorCode.OWNERSHIP_CONFLICT or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        print(f"console: {sent.route} into task {sent.task_id[:8]} (no provider here)")
        console.answer(operator, waiting.request.id, allow=True, source=person)
        print("console: allowed the deploy")

    done = worker.tasks.wait(start.task_id, timeout=30, requester=parent)
    assert done.outcome is not None
    print(f"worker:  task {done.id[:8]} {done.status.value}: {done.outcome.output!r}")
    print(f"worker:  deploy ran {len(runs)} time(s)")
    worker.close()

    with SubagentControl.open(url) as console:  # an idle child, resumed with no provider here
        operator = console.agents.register("ops")
        follow_up = [TextBlock(text="and note it in the changelog")]
        resumed = console.send_message(operator, start.child_id, follow_up, person)
        deadline = time.monotonic() + 10
        seen = console.tasks.get(resumed.task_id, requester=operator)
        while seen.waiting_for is None and not seen.status.is_terminal:
            if time.monotonic() > deadline:
                raise SystemExit("the follow-up was never left for a runtime with the provider")
            time.sleep(0.02)
            seen = console.tasks.get(resumed.task_id, requester=operator)
        print(f"console: {resumed.route} task {resumed.task_id[:8]}, "
              f"{seen.status.value} for a runtime with provider {seen.waiting_for!r}")  # fmt: skip
        more = [TextBlock(text="and tell the team")]
        joined = console.send_message(operator, start.child_id, more, person)
        print(f"console: {joined.route} into the same task: {joined.task_id == resumed.task_id}")

    later = WorkerModel()
    second = SubagentControl.open(url)  # the next worker: it takes the waiting turn
    second.providers.register(InProcessProvider(later, tools=[DRAFT]))
    parent = second.agents.register("ops")
    noted = second.tasks.wait(resumed.task_id, timeout=30, requester=parent)
    assert noted.outcome is not None
    print(f"worker:  ran that task {noted.id[:8]}: {noted.status.value}: {noted.outcome.output}")

    # A long turn, handed over when its runtime closes, to a worker that is running.
    with SubagentControl.open(url) as third:
        third.providers.register(InProcessProvider(later, tools=[DRAFT]))
        watcher = third.agents.register("ops")
        report = second.send_message(parent, start.child_id, [TextBlock(text="write a report")])
        later.entered.wait(30)
        began = time.monotonic()
        second.close()
        print(
            f"worker:  closed in {time.monotonic() - began:.2f}s, mid-turn: the turn is handed over"
        )
        finished = third.tasks.wait(report.task_id, timeout=30, requester=watcher)
        assert finished.outcome is not None
        print(
            f"worker 3: the same task {finished.id[:8]} {finished.status.value} "
            f"(recovered {finished.recoveries} time) {time.monotonic() - began:.2f}s after "
            "the close"
        )


if __name__ == "__main__":
    main()
