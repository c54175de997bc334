"""The A2A front: serve the control plane to A2A clients, and drive it with the SDK's client.

Needs ``pip install 'subagent-control[a2a]'``. Run it::

    python examples/a2a_front.py

It starts ``subagent-control a2a`` as a subprocess on a free loopback port (its children
answer with a scripted model: ``setup`` below is its ``--setup``), then, as an A2A client:
starts a subagent, steers its working task (the same task answers), follows the task to its
end, and continues the subagent later as a new task in the same context.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from a2a.client import Client, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)

from controlplane import InProcessProvider, ScriptedModel, SubagentControl


def setup(control: SubagentControl) -> None:
    """The server's ``--setup``: children echo their newest message, one second per model
    call (long enough for a steer to land mid-turn)."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True, delay_s=1.0)))


def request(
    text: str, *, context_id: str = "", task_id: str = "", wait: bool = False
) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=os.urandom(8).hex(),
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            context_id=context_id,
            task_id=task_id,
        ),
        configuration=SendMessageConfiguration(return_immediately=not wait),
    )


async def answer(client: Client, sent: SendMessageRequest) -> Task:
    """The Task a non-streaming send answered with."""
    async for response in client.send_message(sent):
        return response.task
    raise RuntimeError("no answer")


async def drive(url: str) -> None:
    async with httpx.AsyncClient(timeout=30.0) as http:
        streaming = await create_client(url, ClientConfig(httpx_client=http))
        polling = await create_client(url, ClientConfig(streaming=False, httpx_client=http))

        # Start: no contextId. A streamed send answers with the Task first.
        events = streaming.send_message(request("research the history of the bicycle"))
        task = (await anext(aiter(events))).task
        await events.aclose()
        print(f"started task {task.id} in context {task.context_id}")

        # Steer: the task is working, so the message joins it; the same task answers.
        steer = request("also cover the safety bicycle", context_id=task.context_id)
        steered = await answer(polling, steer)
        print(f"steered: the same task answered: {steered.id == task.id}")

        # Follow the task to its end (any server on the same store could answer this).
        async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
            if event.HasField("status_update"):
                status = event.status_update.status
                said = " ".join(part.text for part in status.message.parts)
                print(f"  {TaskState.Name(status.state)}: {said}".rstrip(": "))
            elif event.HasField("artifact_update"):
                print(f"  output: {event.artifact_update.artifact.parts[0].text}")

        # Continue later: the context is idle, so the subagent resumes as a new task.
        follow_up = request("summarise in one line", context_id=task.context_id, wait=True)
        resumed = await answer(polling, follow_up)
        print(f"resumed as a new task: {resumed.id != task.id}, same context: "
              f"{resumed.context_id == task.context_id}")  # fmt: skip
        print(f"  {TaskState.Name(resumed.status.state)}: {resumed.artifacts[0].parts[0].text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="the store URL (default: a temporary SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        db = args.db or f"sqlite:///{scratch}/state.db"
        here = Path(__file__).resolve().parent
        path = os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}  # so the server finds a2a_front:setup
        server = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "a2a", "--db", db,
             "--http", "127.0.0.1:0", "--setup", "a2a_front:setup"],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            ready = server.stdout.readline().split()
            if ready[:1] != ["ready"]:
                print("the server did not start", file=sys.stderr)
                return 1
            print(f"server: {ready[1]}")
            asyncio.run(asyncio.wait_for(drive(ready[1]), 60))
        finally:
            server.terminate()  # SIGTERM: it stops serving and closes its control plane
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
