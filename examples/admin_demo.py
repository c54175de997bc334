"""Serve the admin socket of a small control plane, and look at it with the CLI.

Starts one child that finishes its turn (its supervisor then sits idle) and one whose model
call is held open (it stays running), serves the admin socket, prints ``ready`` and waits
for SIGTERM or Ctrl-C. In another shell:

    python examples/admin_demo.py --db sqlite:///demo.db --socket /tmp/subagent-demo.sock
    subagent-control tree --socket /tmp/subagent-demo.sock
    subagent-control tree --socket /tmp/subagent-demo.sock --json
    subagent-control children --db sqlite:///demo.db
    subagent-control transcript CHILD --db sqlite:///demo.db

(``python -m controlplane.cli`` works too when the package is not installed.)
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from controlplane import (
    AgentHandle,
    ContinuableStartSpec,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the admin socket of a small control plane.")
    parser.add_argument("--db", default="sqlite:///admin-demo.db", help="store URL")
    parser.add_argument("--socket", required=True, help="where to serve the admin socket")
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with SubagentControl.open(args.db) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["done: summary ready"])))
        # Gated and never released: this child's turn stays running until close() kills it.
        held = ScriptedModel(gated=True)
        control.providers.register(InProcessProvider(held, name="held"))
        parent = control.agents.register(
            "demo-parent", model=ModelSelector(provider="scripted", model="demo")
        )

        finished = control.start_continuable(_spec(parent, "inprocess", "summarise the notes"))
        control.tasks.wait(finished.task_id, timeout=30.0, requester=parent)
        running = control.start_continuable(_spec(parent, "held", "watch the build"))
        if not held.wait_for_calls(1, timeout_s=30.0):
            print("the held child never reached its model call", file=sys.stderr)
            return 1

        control.serve_admin(args.socket)
        print(f"idle child {finished.child_id}; running child {running.child_id}", file=sys.stderr)
        print("ready", flush=True)
        stop.wait()
    return 0


def _spec(parent: AgentHandle, provider: str, label: str) -> ContinuableStartSpec:
    return ContinuableStartSpec(
        provider=provider, label=label, prompt=[TextBlock(text=label)], parent=parent
    )


if __name__ == "__main__":
    sys.exit(main())
