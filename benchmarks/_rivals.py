"""The same history in LangGraph's SQLite checkpointer and the OpenAI Agents SDK's session.

Each rival stores the conversation the way that framework's agents do, and is restored the
way its runtime restores it on a restart: a fresh connection, then LangGraph's
``SqliteSaver.get_tuple`` (the latest checkpoint, deserialised, with its ``messages``
channel) or the Agents SDK's ``SQLiteSession.get_items()`` (every item, decoded). Opening
the connection and creating the schema are outside the timed span, as for ours.
"""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
import time
from pathlib import Path
from typing import Any, Protocol

from benchmarks._history import Message

__all__ = ["LangGraphRival", "OpenAISessionRival", "Rival"]


class Rival(Protocol):
    """A framework's session store under comparison."""

    name: str

    def unavailable(self) -> str | None:
        """Why this rival cannot run here (its package is missing), or None."""
        ...

    def seed(self, key: str, messages: tuple[Message, ...]) -> None:
        """Store ``messages`` under ``key``."""
        ...

    def restore(self, key: str, expected: int) -> float:
        """Seconds to restore ``key``'s ``expected`` messages from a fresh connection."""
        ...

    def close(self) -> None:
        """Release what the rival holds."""
        ...


def _missing(module: str, package: str) -> str | None:
    try:
        importlib.import_module(module)
    except ImportError:
        return f"`{package}` is not installed (pip install -e '.[bench]')"
    return None


class LangGraphRival:
    """LangGraph: one thread whose latest checkpoint holds every message.

    A LangGraph agent (``MessagesState``: an ``add_messages`` channel) writes a checkpoint
    per step, each holding the whole ``messages`` list; a restart reads only the newest one
    (``get_tuple`` without a checkpoint id). Only that newest checkpoint is stored here, so
    the older ones a real thread would also hold cost LangGraph nothing in this comparison.
    """

    name = "LangGraph SqliteSaver"

    def __init__(self, workdir: Path) -> None:
        self._path = workdir / "langgraph.db"

    def unavailable(self) -> str | None:
        """Why LangGraph's checkpointer cannot run here, or None."""
        return _missing("langgraph.checkpoint.sqlite", "langgraph-checkpoint-sqlite")

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    def seed(self, thread_id: str, messages: tuple[Message, ...]) -> None:
        """Store ``messages`` as the thread's latest checkpoint."""
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        values: list[BaseMessage] = [
            HumanMessage(content=m.text, id=f"{thread_id}-{i}")
            if m.role == "user"
            else AIMessage(content=m.text, id=f"{thread_id}-{i}")
            for i, m in enumerate(messages)
        ]
        conn = sqlite3.connect(self._path, check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            checkpoint = empty_checkpoint()
            version = saver.get_next_version(None, None)
            checkpoint["channel_values"] = {"messages": values}
            checkpoint["channel_versions"] = {"messages": version}
            checkpoint["versions_seen"] = {"agent": {"messages": version}}
            config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            metadata: Any = {"source": "loop", "step": len(messages), "parents": {}}
            saver.put(config, checkpoint, metadata, {"messages": version})
        finally:
            conn.close()

    def restore(self, thread_id: str, expected: int) -> float:
        """Seconds to restore the thread's messages from a fresh connection."""
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self._path, check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            config: Any = {"configurable": {"thread_id": thread_id}}
            t0 = time.perf_counter()
            restored = saver.get_tuple(config)
            assert restored is not None
            messages = restored.checkpoint["channel_values"]["messages"]
            elapsed = time.perf_counter() - t0
        finally:
            conn.close()
        if len(messages) != expected:
            raise AssertionError(f"LangGraph restored {len(messages)} of {expected} messages")
        return elapsed


class OpenAISessionRival:
    """OpenAI Agents SDK: ``SQLiteSession`` items, one row per response input item."""

    name = "OpenAI Agents SQLiteSession"

    def __init__(self, workdir: Path) -> None:
        self._path = workdir / "openai-agents.db"
        # get_items() is a coroutine; one loop for all runs keeps loop start-up out of it.
        self._loop = asyncio.new_event_loop()

    def unavailable(self) -> str | None:
        """Why the Agents SDK's session cannot run here, or None."""
        return _missing("agents.memory", "openai-agents")

    def seed(self, session_id: str, messages: tuple[Message, ...]) -> None:
        """Store ``messages`` as the session's items (what ``Runner.run`` adds)."""
        from agents.memory import SQLiteSession

        items: list[Any] = [_item(session_id, i, m) for i, m in enumerate(messages)]
        session = SQLiteSession(session_id, self._path)
        try:
            for start in range(0, len(items), 1000):
                self._loop.run_until_complete(session.add_items(items[start : start + 1000]))
        finally:
            session.close()

    def restore(self, session_id: str, expected: int) -> float:
        """Seconds to read the session's whole history from a fresh session object."""
        from agents.memory import SQLiteSession

        session = SQLiteSession(session_id, self._path)
        try:
            t0 = time.perf_counter()
            items = self._loop.run_until_complete(session.get_items())
            elapsed = time.perf_counter() - t0
        finally:
            session.close()
        if len(items) != expected:
            raise AssertionError(f"SQLiteSession restored {len(items)} of {expected} items")
        return elapsed

    def close(self) -> None:
        """Close the event loop used for the SDK's coroutines."""
        self._loop.close()


def _item(session_id: str, index: int, message: Message) -> dict[str, Any]:
    if message.role == "user":
        return {"role": "user", "content": message.text}
    return {
        "id": f"msg_{session_id}_{index}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": message.text, "annotations": []}],
    }
