"""An ACP agent as a child: start it, continue it in a second turn, show its transcript.

Run it with any Agent Client Protocol agent installed (needs the ``acp`` extra:
``pip install 'subagent-control[acp]'``)::

    python examples/acp_child.py -- gemini --experimental-acp
    python examples/acp_child.py --prompt "list the files here" -- claude-code-acp

Everything after ``--`` is the agent's command line. Each turn is one agent process; the
second turn loads the agent's session when the agent supports it, else it opens a new one
primed with the transcript.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from controlplane import ContinuableStartSpec, SubagentControl, TextBlock


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="Say hello, and remember the word 'otter'.")
    parser.add_argument("--follow-up", default="Which word did I ask you to remember?")
    parser.add_argument("--db", default=f"sqlite:///{Path(tempfile.mkdtemp()) / 'state.db'}")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- AGENT COMMAND...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the agent's command after --, e.g. -- gemini --experimental-acp")
    try:
        from controlplane import AcpProvider

        provider = AcpProvider(command)
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 2

    with SubagentControl.open(args.db) as control:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        start = control.start_continuable(
            ContinuableStartSpec(
                provider="acp",
                label="acp child",
                prompt=[TextBlock(text=args.prompt)],
                parent=parent,
            )
        )
        task_ids = [start.task_id]
        for turn, prompt in enumerate((args.prompt, args.follow_up), start=1):
            if turn == 2:
                sent = control.send_message(parent, start.child_id, [TextBlock(text=prompt)])
                task_ids.append(sent.task_id)
            snapshot = control.tasks.wait(task_ids[-1], timeout=600.0, requester=parent)
            outcome = snapshot.outcome
            answer = (outcome.output or outcome.detail) if outcome else None
            print(f"turn {turn} ({prompt!r}) -> {snapshot.status.value}: {answer}")
            if snapshot.status.value != "completed":
                return 1

        print("\nthe child's transcript:")
        assert control.store is not None
        for event in control.store.load(start.child_id).events:
            print(f"  turn {event.turn}  {event.kind:<20} {str(event.data)[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
