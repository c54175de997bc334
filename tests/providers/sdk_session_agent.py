"""An ACP agent built on the ``agent-client-protocol`` SDK's agent side (`acp.Agent` served
by `acp.run_agent`, as the SDK's examples/agent.py is), for the recovery tests: a peer whose
wire format, replay and cancellation are the SDK's, not ours.

``python sdk_session_agent.py --state DIR [--hold FILE] [--load-session]``. Its sessions
live in ``DIR`` (one JSON history each), so another process can load them. With
``--load-session`` it advertises ``loadSession``, and ``session/load`` replays the history
through ``session/update`` (user and agent message chunks) before it answers; without it,
it advertises no way to reopen a session. A prompt is appended to ``DIR/prompts.jsonl``;
while ``FILE`` exists it waits (at most a minute) for its cancel; then it answers
``echo: <prompt>``, with ``(remembered: ...)`` naming the session's earlier prompts, and
saves the turn. Each process appends its pid to ``DIR/pids``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    text_block,
    update_agent_message,
    update_user_message,
)
from acp.interfaces import Client
from acp.schema import AgentCapabilities, Implementation

HOLD_S = 60.0
POLL_S = 0.02


class SessionAgent(Agent):
    _conn: Client

    def __init__(self, state: Path, hold: Path | None, load: bool) -> None:
        self._state = state
        self._hold = hold
        self._load = load
        self._cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    def _history(self, session_id: str) -> list[list[str]]:
        path = self._state / f"{session_id}.json"
        history: list[list[str]] = json.loads(path.read_text()) if path.exists() else []
        return history

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=self._load),
            agent_info=Implementation(name="sdk-session-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sdk-{uuid.uuid4().hex[:12]}"
        (self._state / f"{session_id}.json").write_text("[]")
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        if not (self._state / f"{session_id}.json").exists():
            raise RequestError.invalid_params({"sessionId": session_id})
        for role, text in self._history(session_id):  # the replay a client must not record
            chunk = update_user_message if role == "user" else update_agent_message
            await self._conn.session_update(session_id, chunk(text_block(text)))
        return LoadSessionResponse()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        texts = [getattr(block, "text", "") for block in prompt]
        with (self._state / "prompts.jsonl").open("a") as log:
            log.write(json.dumps({"session": session_id, "texts": texts}) + "\n")
        cancelled = self._cancelled.setdefault(session_id, asyncio.Event())
        if self._hold is not None and self._hold.exists():
            await self._conn.session_update(
                session_id, update_agent_message(text_block("working on it"))
            )
            for _ in range(int(HOLD_S / POLL_S)):  # bounded: a test that never cancels ends
                if cancelled.is_set():
                    return PromptResponse(stop_reason="cancelled")
                await asyncio.sleep(POLL_S)
        history = self._history(session_id)
        reply = f"echo: {texts[-1] if texts else ''}"
        remembered = [text for role, text in history if role == "user"]
        if remembered:
            reply += f" (remembered: {' | '.join(remembered)})"
        await self._conn.session_update(session_id, update_agent_message(text_block(reply)))
        history += [["user", texts[-1] if texts else ""], ["agent", reply]]
        (self._state / f"{session_id}.json").write_text(json.dumps(history))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self._cancelled.setdefault(session_id, asyncio.Event()).set()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--hold", type=Path)
    parser.add_argument("--load-session", action="store_true")
    args = parser.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    with (args.state / "pids").open("a") as log:
        log.write(f"{os.getpid()}\n")
    await run_agent(SessionAgent(args.state, args.hold, args.load_session))


if __name__ == "__main__":
    asyncio.run(main())
