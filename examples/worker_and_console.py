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
   the console's message, the Task completes.
4. The console sends the now idle child a follow-up: it has no provider, so it answers
   ``started`` with the message durable, the Task reads ``queued`` (``waiting_for`` the
   provider), and the worker runs that turn at its next sweep.
5. The worker's first runtime closes in the middle of a second, long turn: `close()` hands
   the turn over, and a new worker runtime carries the same Task on to the end (recovered
   once), with nothing sent by anyone.

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


class SlowModel:
    """A model whose first call lasts until its run is stopped (the turn in flight when the
    worker closes), and which answers every later call at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            signal.wait(60)
            signal.raise_if_aborted()
        return ModelReply(text=f"finished the report ({len(request.messages)} messages read)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=f"sqlite:///{tempfile.mkdtemp()}/state.db")
    url = parser.parse_args().db

    runs: list[str] = []
    model = ScriptedModel([DEPLOY, "deployed, and checked the logs"])
    # A short lease: its sweep, which takes Tasks left for its provider, runs every second.
    worker = SubagentControl.open(url, approval_grace_s=0.05, lease_ttl_s=3.0)
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

    with SubagentControl.open(url) as console:  # no providers registered
        operator = console.agents.register("ops")
        person = MessageSource(kind="human", sender_session_id="alice")
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
    noted = worker.tasks.wait(resumed.task_id, timeout=30, requester=parent)
    assert noted.outcome is not None
    print(f"worker:  ran that task {noted.id[:8]}: {noted.status.value}")

    # A long second turn, handed over when its runtime closes.
    slow = SlowModel()
    worker.providers.register(InProcessProvider(slow, tools=[deploy_tool(runs)]))
    second = worker.send_message(parent, start.child_id, [TextBlock(text="write a report")])
    slow.entered.wait(30)
    began = time.monotonic()
    worker.close()
    print(f"worker:  closed in {time.monotonic() - began:.2f}s, mid-turn: the turn is handed over")

    with SubagentControl.open(url) as next_worker:
        next_worker.providers.register(InProcessProvider(slow, tools=[deploy_tool(runs)]))
        again = next_worker.agents.register("ops")
        report = next_worker.tasks.wait(second.task_id, timeout=30, requester=again)
        assert report.outcome is not None
        print(
            f"worker 2: the same task {report.id[:8]} {report.status.value} "
            f"(recovered {report.recoveries} time): {report.outcome.output!r}"
        )


if __name__ == "__main__":
    main()
