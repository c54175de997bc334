"""Slow clients cannot lock a token-protected front out (`controlplane.fronts._http_limits`).

Each front runs as the real command on a bind with a token, in a process allowed 256 open
files. Before the limits, connections that trickled their request's head were never timed
out: a few hundred of them held every descriptor, and an authorized call timed out.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.fronts._http_limits import HEAD_S, MAX_HALF_SENT
from tests.fronts.a2a_support import A2AProcess
from tests.fronts.mcp_support import HttpServer
from tests.fronts.scripted_setup import DESCRIPTORS
from tests.reliability.processes import Reaper, reaping
from tests.support import WAIT_S

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")

TOKEN = "slow-clients-token"
TRICKLERS = DESCRIPTORS + 100
"""More half-sent connections than the front may have files open."""


@contextlib.contextmanager
def trickling(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that each sent the start of a request's head, and no more."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` (an end of file, or a reset: it had unread
    bytes) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _port(url: str) -> int:
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def _authorized_a2a_call(url: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    return httpx.post(url, json=body, headers=headers, timeout=WAIT_S)


def test_an_authorized_a2a_call_is_served_while_hundreds_of_clients_trickle(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    server = reaped.add(
        A2AProcess(
            sqlite_url, "--setup", "tests.fronts.a2a_setup:few_descriptors", "--token", TOKEN,
            name="a2a", stderr=tmp_path / "a2a.err",
        )
    )  # fmt: skip
    url = server.ready()
    with trickling(_port(url), TRICKLERS):
        answered = _authorized_a2a_call(url)
    assert answered.status_code == 200, answered.text
    assert answered.json()["error"]["code"] != -32603, answered.json()


def test_an_authorized_mcp_call_is_served_while_hundreds_of_clients_trickle(
    reaped: Reaper, sqlite_url: str
) -> None:
    server = HttpServer(reaped, sqlite_url, "--token", TOKEN, setup="few_descriptors")
    with trickling(_port(server.url), TRICKLERS):
        answered = httpx.post(
            server.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Accept": "application/json, text/event-stream",
            },
            timeout=WAIT_S,
        )
    assert answered.status_code < 500, answered.text


def test_a_head_that_does_not_arrive_in_time_is_closed_and_the_oldest_tricklers_first(
    reaped: Reaper, sqlite_url: str, tmp_path: Path
) -> None:
    server = reaped.add(
        A2AProcess(
            sqlite_url, "--setup", "tests.fronts.a2a_setup:setup", "--token", TOKEN,
            name="a2a", stderr=tmp_path / "a2a.err",
        )
    )  # fmt: skip
    url = server.ready()
    with trickling(_port(url), MAX_HALF_SENT + 1) as held:
        oldest, newest = held[0], held[-1]
        assert closed_by_server(oldest, WAIT_S)  # at once: one trickler too many
        assert closed_by_server(newest, HEAD_S + WAIT_S)  # once its head was late
    assert _authorized_a2a_call(url).status_code == 200
