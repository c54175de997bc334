"""A real child: a Chat Completions model with one tool, continued after its first turn.

Run it against any OpenAI-compatible server (needs ``pip install 'subagent-control[openai]'``)::

    python examples/openai_child.py --base-url http://127.0.0.1:11434/v1 --model llama3.2
    python examples/openai_child.py --model gpt-4o-mini            # OpenAI, OPENAI_API_KEY set

The child is asked to count the words of a sentence with its ``word_count`` tool; a
follow-up after the turn resumes it from its transcript (tool call and result included).
With no server listening it says how to start one.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    SubagentControl,
    TextBlock,
)

NO_SERVER = """\
No model server answers at {url}. Start one, for example:
  ollama serve & ollama pull llama3.2
      then: --base-url http://127.0.0.1:11434/v1 --model llama3.2
  vllm serve Qwen/Qwen2.5-1.5B-Instruct
      then: --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
  llama-server -m model.gguf --port 8080 --jinja
      then: --base-url http://127.0.0.1:8080/v1 --model any
or use OpenAI itself: export OPENAI_API_KEY=... and pass --model gpt-4o-mini."""


class WordCount(BaseModel):
    """Arguments of the word_count tool."""

    text: str


def word_count(arguments: dict[str, object]) -> str:
    return str(len(str(arguments["text"]).split()))


def reachable(base_url: str) -> bool:
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=2.0):
            return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="the server's /v1 URL (default: OpenAI)")
    parser.add_argument("--model", required=True, help="the model name the server knows")
    parser.add_argument("--db", default=f"sqlite:///{Path(tempfile.mkdtemp()) / 'state.db'}")
    args = parser.parse_args()
    try:
        from controlplane.models import OpenAIChatModel

        model = OpenAIChatModel(args.model, base_url=args.base_url, max_retries=1)
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not reachable(model.base_url):
        print(NO_SERVER.format(url=model.base_url), file=sys.stderr)
        return 2

    tool = ChildTool("word_count", "Count the words of a text.", WordCount, word_count)
    with SubagentControl.open(args.db) as control:
        control.providers.register(InProcessProvider(model, tools=[tool]))
        parent = control.agents.register("parent-1")
        start = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label="count words",
                prompt=[TextBlock(text="Use word_count on: 'the quick brown fox jumps'.")],
                parent=parent,
                persona="You are a careful assistant. Use your tools; answer in one line.",
            )
        )
        for prompt in (None, "Now double that number."):
            task_id = start.task_id
            if prompt is not None:
                task_id = control.send_message(
                    parent, start.child_id, [TextBlock(text=prompt)]
                ).task_id
            snapshot = control.tasks.wait(task_id, timeout=300.0, requester=parent)
            outcome = snapshot.outcome
            answer = outcome.output if outcome and outcome.output else outcome and outcome.detail
            print(f"turn -> {snapshot.status.value}: {answer}")
            if snapshot.status.value != "completed":
                return 1

        print("\nthe child's transcript:")
        assert control.store is not None
        for event in control.store.load(start.child_id).events:
            print(f"  turn {event.turn}  {event.kind:<20} {_short(event.data)}")
    return 0


def _short(data: object) -> str:
    text = str(data)
    return text if len(text) <= 90 else text[:89] + "…"


if __name__ == "__main__":
    sys.exit(main())
