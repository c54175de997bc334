"""Helpers shared by the CLI tests: hand-built trees and raw socket exchanges."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from controlplane import ActorTree
from controlplane.contract import (
    ActivationNode,
    SupervisorNode,
)
from persistence._schema import approvals_table


def sample_tree() -> ActorTree:
    """One idle supervisor and one with a running, published activation."""
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return ActorTree(
        taken_at=now,
        closed=False,
        supervisors=[
            SupervisorNode(
                child_id="child-idle",
                parent_session="parent-1",
                state="idle",
                last_activity=now,
            ),
            SupervisorNode(
                child_id="child-busy",
                parent_session="parent-1",
                state="running",
                task_id="task-7",
                task_status="running",
                held_messages=1,
                mailbox_depth=2,
                last_activity=now,
                activation=ActivationNode(
                    task_id="task-7",
                    kind="resumed",
                    published=True,
                    task_status="running",
                    cancel_reason=None,
                    age_s=1.5,
                ),
            ),
        ],
    )


def exchange(path: Path | str, payload: bytes, *, half_close: bool = False) -> bytes:
    """Send ``payload`` and return everything the server sends back until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10.0)
        conn.connect(str(path))
        try:
            conn.sendall(payload)
            if half_close:
                conn.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the whole payload is sent
        return read_until_close(conn)


def read_until_close(conn: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_line(conn: socket.socket) -> dict[str, Any]:
    """Read exactly one reply line."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        assert chunk, f"connection closed after {bytes(data)!r}"
        data += chunk
    reply = json.loads(data)
    assert isinstance(reply, dict)
    return reply


def ask_tree(path: Path | str) -> dict[str, Any]:
    """One well-formed tree request on a fresh connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10.0)
        conn.connect(str(path))
        conn.sendall(b'{"op": "tree"}\n')
        return read_line(conn)


REPO_ROOT = Path(__file__).resolve().parents[2]


def start_ready_process(args: list[str], *, timeout_s: float = 60.0) -> subprocess.Popen[str]:
    """Start ``python ARGS`` in the repo root and return once it printed ``ready``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line: list[str] = []
    seen = threading.Event()

    def read_first_line() -> None:
        assert proc.stdout is not None
        first_line.append(proc.stdout.readline())
        seen.set()

    threading.Thread(target=read_first_line, daemon=True).start()
    if not seen.wait(timeout_s) or first_line[0].strip() != "ready":
        stop_process(proc)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"{args} did not print ready: {first_line!r}\n{err}")
    return proc


def stop_process(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, then wait for the exit status (kill if it does not stop)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


def insert_requests(url: str, ids: list[str]) -> None:
    """Write open approval requests with these ids (for the CLI's id lookups only: no
    child or Task stands behind them)."""
    engine = sa.create_engine(url)
    now = datetime.now(UTC)
    row: dict[str, Any] = {
        "task_id": "t", "child_id": "c", "parent_session": "p", "turn": 1, "call_id": "c1",
        "tool": "deploy", "provider": "inprocess", "arguments": "{}", "pending": "[]",
        "parkable": True, "state": "open", "created_at": now,
    }  # fmt: skip
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(approvals_table), [row | {"request_id": rid} for rid in ids])
    finally:
        engine.dispose()
