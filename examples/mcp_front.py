"""An MCP client drives subagents through `subagent-control mcp` (the MCP front).

Run it with:  python examples/mcp_front.py [--db URL]
(needs the mcp extra: pip install 'subagent-control[mcp]')

It starts the server as a stdio subprocess, exactly as an MCP client such as Claude Desktop
or Claude Code would (``subagent-control mcp --db URL --setup mcp_front:setup``), then, as
that client: lists the tools, starts a child, waits for its output, sends it a follow-up
(which continues the same conversation as a new task), and follows that task as an MCP
task (``io.modelcontextprotocol/tasks``). Children here run on a scripted echo model that
`setup` registers; ``--openai-model NAME`` would run them on a real one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio

from controlplane import InProcessProvider, ScriptedModel, SubagentControl

HERE = Path(__file__).resolve().parent


def setup(control: SubagentControl) -> None:
    """``--setup mcp_front:setup``: the server's children answer ``echo: <message>``."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True)))


async def drive(db: str) -> None:
    from mcp import Client, StdioServerParameters

    from controlplane.fronts.mcp_tasks import CreatedTask, TasksClient, task_result

    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "controlplane.cli", "mcp", "--db", db, "--setup", "mcp_front:setup"],
        cwd=str(HERE),  # --setup finds mcp_front.py here
    )
    async with Client(server, extensions=[TasksClient()]) as client:
        tools = await client.list_tools()
        print("tools:", ", ".join(tool.name for tool in tools.tools))

        def text(result: object) -> str:
            return "".join(getattr(block, "text", "") for block in getattr(result, "content", []))

        # With the extension declared, call_tool follows the task the start became to
        # its result: the task_output text a model would read.
        start = {"description": "otter facts", "prompt": "find three otter facts"}
        print("subagent      ->", text(await client.call_tool("subagent", start)))
        agents = text(await client.call_tool("list_agents", {}))
        print("list_agents   ->", agents)
        child_id = agents.split()[0]

        # The follow-up resumes the idle child: the server answers with an MCP task.
        follow_up = {"subagent_id": child_id, "message": "now only sea otters"}
        created = await client.session.call_tool("send_message", follow_up, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        print(f"send_message  -> MCP task {created.task_id} ({created.status})")
        print("tasks/result  ->", text(await task_result(client.session, created.task_id)))
        print("list_agents   ->", text(await client.call_tool("list_agents", {})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="the store URL (default: a temporary SQLite file)")
    args = parser.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'state.db'}"
    anyio.run(drive, db)


if __name__ == "__main__":
    main()
