"""subagent-control in two minutes: start, steer, settle, restart, resume, kill, inspect.

Run it with:  python examples/quickstart.py  [--db URL] [--socket PATH] [--serve]

Everything runs on an embedded SQLite file (``demo.db`` in the working directory unless
``--db`` names another store); the "model" is a tiny stand-in adapter that answers from
the conversation it is given, so you can see what each child remembers. It ends by
printing the commands that inspect what it did; with ``--serve`` it then keeps serving
its admin socket (``--socket``) for ``tree`` and ``top`` until Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import threading

from controlplane import (
    AgentHandle,
    CancelSignal,
    ContinuableStartSpec,
    InProcessProvider,
    ModelSelector,
    SubagentControl,
    TextBlock,
)
from controlplane.models import (
    ModelReply,
    ModelRequest,
)


class RecallModel:
    """A stand-in for a real model: it answers by listing the requests it has seen.

    ``hold()`` makes the next calls wait until ``let_go()``, so the demo can show a child
    mid-turn (a real model call takes seconds; this one takes microseconds).
    """

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.waiting = threading.Event()

    def hold(self) -> None:
        self.waiting.clear()
        self._open.clear()

    def let_go(self) -> None:
        self._open.set()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        self.waiting.set()
        signal.add_callback(lambda _reason: self._open.set())
        self._open.wait()
        signal.raise_if_aborted()
        asks = [m.text for m in request.messages if m.role == "user"]
        who = request.system or "assistant"
        return ModelReply(text=f"[{who}] {len(asks)} request(s) so far: " + " | ".join(asks))


def say(text: str) -> None:
    print(text, flush=True)


def outcome_line(control: SubagentControl, parent: AgentHandle, task_id: str) -> str:
    snap = control.tasks.wait(task_id, timeout=10, requester=parent)
    out = snap.outcome
    assert out is not None
    text = out.output if out.status == "completed" else out.detail
    return f"{snap.status.value:<9} {text}"


DEFAULT_DB = "sqlite:///demo.db"
DEFAULT_SOCKET = "/tmp/subagent-control-demo.sock"
CLI = ".venv/bin/subagent-control"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=DEFAULT_DB, help="store URL (default: %(default)s)")
    parser.add_argument(
        "--socket", default=DEFAULT_SOCKET, help="admin socket path (default: %(default)s)"
    )
    parser.add_argument(
        "--serve", action="store_true", help="keep serving the admin socket until Ctrl-C"
    )
    args = parser.parse_args()
    url = args.db
    model = RecallModel()

    def open_control() -> SubagentControl:
        control = SubagentControl.open(url)
        control.providers.register(InProcessProvider(model))
        return control

    say(f"store: {url}\n")
    control = open_control()
    parent = control.agents.register("parent-1", model=ModelSelector(provider="demo", model="m1"))

    say("1. start two background children")
    model.hold()
    research = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess",
            label="research",
            persona="researcher",
            parent=parent,
            prompt=[TextBlock(text="find three facts about otters")],
        )
    )
    summary = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess",
            label="summary",
            persona="summarizer",
            parent=parent,
            prompt=[TextBlock(text="summarize the otter facts")],
        )
    )
    say(f"   research  child {research.child_id[:8]}  task {research.task_id[:8]}")
    say(f"   summary   child {summary.child_id[:8]}  task {summary.task_id[:8]}")

    say("\n2. steer 'research' mid-turn (the reply comes once the message is durable)")
    sent = control.send_message(parent, research.child_id, [TextBlock(text="focus on sea otters")])
    say(f"   route={sent.route}  task {sent.task_id[:8]} (the same Task)")

    say("\n3. while both are mid-turn, the actor tree:")
    say("   " + control.dump_tree().render().replace("\n", "\n   "))

    say("\n4. let both settle")
    model.let_go()
    say(f"   research  {outcome_line(control, parent, research.task_id)}")
    say(f"   summary   {outcome_line(control, parent, summary.task_id)}")

    say("\n5. restart: close the control plane, reopen it on the same file")
    control.close()
    control = open_control()
    parent = control.agents.register("parent-1", model=ModelSelector(provider="demo", model="m1"))

    say("\n6. follow up with 'research': it resumes from its transcript")
    sent = control.send_message(parent, research.child_id, [TextBlock(text="which fact is best?")])
    say(f"   route={sent.route}  new task {sent.task_id[:8]}")
    say(f"   research  {outcome_line(control, parent, sent.task_id)}")

    say("\n7. follow up with 'summary', then kill that activation")
    model.hold()
    sent = control.send_message(parent, summary.child_id, [TextBlock(text="make it shorter")])
    model.waiting.wait(5)
    control.tasks.kill(sent.task_id, requester=parent)
    say(f"   summary   {outcome_line(control, parent, sent.task_id)}")
    model.let_go()

    say("\n8. the research child's durable transcript")
    assert control.store is not None
    for event in control.store.load(research.child_id).events:
        source = f" from {event.source.kind}" if event.source else ""
        text = event.data.get("text", "") if isinstance(event.data, dict) else ""
        say(f"   #{event.seq:<2} turn {event.turn}  {event.kind:<20}{source:<18} {text[:60]}")

    say("\ntasks of parent-1 in this process:")
    for snap in control.tasks.list(parent):
        say(f"   {snap.id[:8]}  {snap.status.value:<9} {snap.label}")

    say(f"\n9. inspect it: the store stays in {url}")
    say(f"   {CLI} children --db {url}")
    say(f"   {CLI} transcript {research.child_id[:8]} --db {url}")
    say(f"   {CLI} tasks --db {url}")
    live = "while it serves" if args.serve else "while it serves (run it again with --serve)"
    say(f"   live views of this process, {live}:")
    say(f"   {CLI} tree --socket {args.socket}")
    say(f"   {CLI} top --socket {args.socket}")
    if args.serve:
        control.serve_admin(args.socket)
        say(f"\nserving {args.socket} until Ctrl-C")
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _signum, _frame: stop.set())
        stop.wait()
    control.close()


if __name__ == "__main__":
    main()
