"""MCP tasks as the 2025-11-25 core had them, for handshake-era clients: ``capabilities.tasks``
at ``initialize``, ``params.task`` on ``tools/call``, then ``tasks/get``, ``tasks/result`` and
``tasks/cancel``. Spoken by hand over stdio to ``python -m controlplane.cli mcp`` (the SDK's
client no longer reads these answers)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fronts.mcp_support import RawStdio
from tests.reliability.processes import Reaper

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

_START = {"name": "subagent", "arguments": {"description": "d", "prompt": "hi"}, "task": {}}


def _until_settled(server: RawStdio, task_id: str) -> dict[str, Any]:
    for _ in range(200):  # bounded: the echo child settles in milliseconds
        task: dict[str, Any] = server.request("tasks/get", {"taskId": task_id})["result"]
        if task["status"] not in ("working", "input_required"):
            return task
    raise AssertionError(f"task {task_id} never settled")


def test_a_client_declaring_tasks_gets_a_task_and_follows_it_to_its_result(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = RawStdio(reaped, sqlite_url)
    capabilities = server.initialize({"tasks": {}})["capabilities"]

    task = server.request("tools/call", _START)["result"]["task"]
    settled = _until_settled(server, task["taskId"])
    result = server.request("tasks/result", {"taskId": task["taskId"]})["result"]

    assert capabilities["tasks"]["requests"] == {"tools": {"call": {}}}
    assert task["status"] == "working"
    assert task["pollInterval"] > 0
    assert settled["status"] == "completed"
    assert "result" not in settled  # 2025-11-25: the result is tasks/result's
    assert result["content"] == [{"type": "text", "text": "echo: hi\n[status: completed]"}]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}


def test_tasks_cancel_answers_with_the_cancelled_task_and_refuses_a_second_time(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = RawStdio(reaped, sqlite_url, setup="slow")
    server.initialize({"tasks": {}})
    task_id = server.request("tools/call", _START)["result"]["task"]["taskId"]

    cancelled = server.request("tasks/cancel", {"taskId": task_id})["result"]
    again = server.request("tasks/cancel", {"taskId": task_id})["error"]

    assert cancelled["status"] == "cancelled"
    assert again["code"] == -32602


def test_a_client_that_did_not_declare_tasks_gets_the_plain_result(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = RawStdio(reaped, sqlite_url)
    server.initialize({})

    result = server.request("tools/call", _START)["result"]
    unknown = server.request("tasks/get", {"taskId": "no-such-task"})["error"]

    assert result["content"][0]["text"].startswith("started subagent ")
    assert unknown["code"] == -32602
    assert unknown["data"] == {"code": "TASK_NOT_FOUND"}
