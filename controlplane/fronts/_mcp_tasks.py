"""Our Tasks as MCP tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663).

A client that declares the extension on a ``tools/call`` gets, for a call that started an
activation (``subagent``, or a ``send_message`` that resumed an idle child), a task handle
whose ``taskId`` is our Task id. Everything a task says afterwards is read from our Task
row under the front's parent session, so any server process on the same store answers
``tasks/get``, ``tasks/result`` and ``tasks/cancel`` for it, after restarts too, and a
Task of another parent session is not found (its existence is not leaked).

The mapping of statuses: ``running`` and ``queued`` → ``working``; ``input_required`` →
``input_required``; ``completed`` → ``completed`` (the ``task_output`` text as the
result); ``killed`` → ``cancelled``; ``failed`` and ``interrupted`` → ``failed``, with a
JSON-RPC error whose data carries our code and the ``task_output`` text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from controlplane.contract import TaskSnapshot

__all__ = [
    "POLL_INTERVAL_MS",
    "TASKS_EXTENSION",
    "TASK_FAILED",
    "call_tool_result",
    "created_task_id",
    "detailed_task",
    "task_fields",
    "wants_tasks",
]

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
"""The extension identifier a client declares in its per-request capabilities."""

POLL_INTERVAL_MS: Final = 500
"""How often a client is asked to poll ``tasks/get`` at most."""

TASK_FAILED: Final = -32603
"""The JSON-RPC error code of a ``failed`` task (the work failed inside the server)."""

_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"

_STATUS: Final[Mapping[str, str]] = {
    "running": "working",
    "queued": "working",
    "input_required": "input_required",
    "completed": "completed",
    "failed": "failed",
    "killed": "cancelled",
    "interrupted": "failed",
}

# The tool texts of a call that started an activation: kept exactly, so they are a
# stable place to read the Task id from (ToolHandlers returns text, nothing else).
_STARTED: Final = (
    re.compile(r"^started subagent \S+ as task (?P<task>\S+)$"),
    re.compile(r"^message started task (?P<task>\S+) continuing subagent \S+$"),
)


def wants_tasks(meta: Mapping[str, Any] | None) -> bool:
    """Whether a request's ``_meta`` declares the tasks extension in its capabilities.

    Per request, as the extension requires: a client that did not declare it on this
    request never gets a task handle.
    """
    capabilities = (meta or {}).get(_CLIENT_CAPABILITIES)
    if not isinstance(capabilities, Mapping):
        return False
    extensions = capabilities.get("extensions")
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def created_task_id(tool: str, text: str, *, is_error: bool) -> str | None:
    """The Task id a tool call started, or None for a call that started nothing."""
    if is_error or tool not in ("subagent", "send_message"):
        return None
    for pattern in _STARTED:
        match = pattern.match(text)
        if match is not None:
            return match.group("task")
    return None


def task_fields(snapshot: TaskSnapshot) -> dict[str, Any]:
    """The wire ``Task`` of a snapshot (status, times, polling hint)."""
    status = snapshot.status.value
    updated = snapshot.settled_at or snapshot.admitted_at or snapshot.created_at
    fields: dict[str, Any] = {
        "taskId": snapshot.id,
        "status": _STATUS.get(status, "working"),
        "statusMessage": _status_message(snapshot),
        "createdAt": snapshot.created_at.isoformat(),
        "lastUpdatedAt": updated.isoformat(),
        # Our Tasks are kept in the store for good: no expiry to announce.
        "ttlMs": None,
    }
    if not snapshot.status.is_terminal:
        fields["pollIntervalMs"] = POLL_INTERVAL_MS
    return fields


def detailed_task(snapshot: TaskSnapshot, output_text: str | None) -> dict[str, Any]:
    """The ``DetailedTask`` of ``tasks/get``: the task plus its result, error or requests.

    Args:
        snapshot: Our Task.
        output_text: The ``task_output`` text of a settled Task (None while it runs).
    """
    fields = task_fields(snapshot)
    status = fields["status"]
    if status == "completed":
        fields["result"] = call_tool_result(output_text or "", is_error=False)
    elif status == "failed":
        outcome = snapshot.outcome
        fields["error"] = {
            "code": TASK_FAILED,
            "message": (outcome.detail if outcome else None) or snapshot.status.value,
            "data": {
                "status": snapshot.status.value,
                "code": outcome.code.value if outcome and outcome.code else None,
                "output": output_text,
            },
        }
    elif status == "input_required":
        # The approval is answered with the `answer` tool, not with tasks/update.
        fields["inputRequests"] = {}
    return fields


def call_tool_result(text: str, *, is_error: bool) -> dict[str, Any]:
    """A ``CallToolResult`` carrying one text block."""
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _status_message(snapshot: TaskSnapshot) -> str:
    status = snapshot.status.value
    if status == "queued" and snapshot.queue_position is not None:
        return f"{snapshot.label} (queued, position {snapshot.queue_position})"
    if status == "input_required":
        request = getattr(snapshot, "request", None)
        tool = getattr(request, "tool", None)
        asked = f" to run {tool}" if tool else ""
        return f"{snapshot.label} (waiting for an approval{asked}; answer it with the answer tool)"
    return f"{snapshot.label} ({status})"
