"""The admin socket: 0600, read-only, one tree per request, robust to hostile clients."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controlplane import ActorTree, ErrorCode, SubagentControlError
from controlplane.runtime._admin import AdminServer
from tests.cli.cli_support import ask_tree, exchange, read_line, sample_tree


@pytest.fixture
def server(sock_dir: Path) -> Iterator[AdminServer]:
    with AdminServer(sock_dir / "admin.sock", dump=sample_tree) as srv:
        yield srv


def error_code(raw: bytes) -> str:
    """The error code of the single reply line in ``raw``."""
    lines = raw.splitlines()
    assert len(lines) == 1, raw
    reply = json.loads(lines[0])
    assert reply["ok"] is False
    assert set(reply["error"]) == {"code", "message"}
    assert reply["error"]["message"]
    return str(reply["error"]["code"])


def test_socket_is_created_with_mode_0600_and_no_staging_directory_is_left(
    server: AdminServer, sock_dir: Path
) -> None:
    mode = os.lstat(server.path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert sorted(os.listdir(sock_dir)) == ["admin.sock"]


def test_tree_request_returns_the_dump_as_json_that_parses_back_into_an_actor_tree(
    server: AdminServer,
) -> None:
    reply = ask_tree(server.path)
    assert reply["ok"] is True
    assert ActorTree.model_validate(reply["tree"]) == sample_tree()


def test_one_connection_can_carry_several_requests_in_order(server: AdminServer) -> None:
    raw = exchange(server.path, b'{"op":"tree"}\n{"op":"kill"}\n{"op":"tree"}\n', half_close=True)
    replies = [json.loads(line) for line in raw.splitlines()]
    assert [r["ok"] for r in replies] == [True, False, True]
    assert replies[1]["error"]["code"] == "UNKNOWN_OP"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        pytest.param(b"\x00\xff\xfe garbage\n", "BAD_REQUEST", id="binary-garbage"),
        pytest.param(b"not json at all\n", "BAD_REQUEST", id="not-json"),
        pytest.param(b'["op", "tree"]\n', "BAD_REQUEST", id="non-object"),
        pytest.param(b"\n", "BAD_REQUEST", id="empty-line"),
        pytest.param(b'{"op": "kill"}\n', "UNKNOWN_OP", id="kill"),
        pytest.param(b'{"op": "stop", "child": "x"}\n', "UNKNOWN_OP", id="stop"),
        pytest.param(b'{"tree": true}\n', "UNKNOWN_OP", id="no-op"),
        pytest.param(b'{"op": "tr', "INCOMPLETE_REQUEST", id="partial-then-eof"),
    ],
)
def test_a_bad_request_gets_an_error_reply_and_the_server_serves_the_next_client(
    server: AdminServer, payload: bytes, code: str
) -> None:
    assert error_code(exchange(server.path, payload, half_close=True)) == code
    assert ask_tree(server.path)["ok"] is True


def test_an_oversized_request_is_cut_off_and_the_server_serves_the_next_client(
    sock_dir: Path,
) -> None:
    with AdminServer(sock_dir / "a.sock", dump=sample_tree, max_request_bytes=64) as srv:
        raw = exchange(srv.path, b"x" * 10_000)  # no newline ever comes
        # Either the error line arrives, or the close with unread data resets the stream.
        assert raw == b"" or error_code(raw) == "REQUEST_TOO_LARGE"
        raw = exchange(srv.path, b'{"op": "tree", "pad": "' + b"y" * 100 + b'"}\n')
        assert raw == b"" or error_code(raw) == "REQUEST_TOO_LARGE"
        assert ask_tree(srv.path)["ok"] is True


def test_a_request_of_exactly_the_size_limit_is_served(sock_dir: Path) -> None:
    line = b'{"op": "tree", "pad": "' + b"y" * 30 + b'"}'
    with AdminServer(sock_dir / "a.sock", dump=sample_tree, max_request_bytes=len(line)) as srv:
        reply = json.loads(exchange(srv.path, line + b"\n", half_close=True))
        assert reply["ok"] is True


def test_a_slow_client_gets_a_timeout_while_other_clients_are_served(sock_dir: Path) -> None:
    with (
        AdminServer(sock_dir / "a.sock", dump=sample_tree, timeout_s=0.3) as srv,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow,
    ):
        slow.settimeout(10.0)
        slow.connect(srv.path)
        slow.sendall(b'{"op": ')
        assert ask_tree(srv.path)["ok"] is True  # served while the slow one dawdles
        assert read_line(slow)["error"]["code"] == "TIMEOUT"
        assert slow.recv(1) == b""  # and then closed


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        pytest.param(RuntimeError("boom"), "DUMP_FAILED", id="foreign-exception"),
        pytest.param(
            SubagentControlError(ErrorCode.CLOSED, "the control plane is closed"),
            "CLOSED",
            id="control-plane-error",
        ),
    ],
)
def test_a_dump_that_raises_gets_an_error_reply_and_the_server_keeps_serving(
    sock_dir: Path, failure: Exception, code: str
) -> None:
    calls: list[int] = []

    def dump() -> ActorTree:
        calls.append(1)
        if len(calls) == 1:
            raise failure
        return sample_tree()

    with AdminServer(sock_dir / "a.sock", dump=dump) as srv:
        reply = ask_tree(srv.path)
        assert reply["error"]["code"] == code
        assert str(failure.args[0]) in reply["error"]["message"]
        assert ask_tree(srv.path)["ok"] is True


def test_connections_beyond_the_bound_get_busy_and_are_served_once_a_slot_frees(
    sock_dir: Path,
) -> None:
    with AdminServer(sock_dir / "a.sock", dump=sample_tree, max_connections=1) as srv:
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        holder.settimeout(10.0)
        holder.connect(srv.path)
        holder.sendall(b'{"op": "tree"}\n')
        assert read_line(holder)["ok"] is True  # its handler now holds the only slot
        assert error_code(exchange(srv.path, b'{"op": "tree"}\n')) == "BUSY"
        holder.close()
        assert _eventually(lambda: ask_tree(srv.path)["ok"] is True)


def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    # The freed slot is released by the server's own thread after it sees EOF.
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        try:
            if check():
                return True
        except OSError:
            pass  # refused as BUSY before the request was written
        done.wait(0.01)
    return False


def test_close_removes_the_socket_ends_open_connections_and_is_idempotent(
    sock_dir: Path,
) -> None:
    srv = AdminServer(sock_dir / "a.sock", dump=sample_tree).start()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.settimeout(10.0)
    idle.connect(srv.path)
    idle.sendall(b'{"op": "tree"}\n')
    assert read_line(idle)["ok"] is True
    srv.close()
    assert not os.path.exists(srv.path)
    assert idle.recv(1) == b""
    idle.close()
    srv.close()
    assert not srv.is_serving
    with pytest.raises(SubagentControlError) as info:
        srv.start()
    assert info.value.code is ErrorCode.CLOSED


def test_close_leaves_a_socket_that_another_server_put_at_the_same_path(sock_dir: Path) -> None:
    first = AdminServer(sock_dir / "a.sock", dump=sample_tree).start()
    os.unlink(first.path)  # an operator removed it; a second server takes the path
    with AdminServer(sock_dir / "a.sock", dump=sample_tree) as second:
        first.close()
        assert ask_tree(second.path)["ok"] is True


def test_start_replaces_a_stale_socket(sock_dir: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_dir / "a.sock"))
    stale.close()  # the file stays, nobody accepts on it
    with AdminServer(sock_dir / "a.sock", dump=sample_tree) as srv:
        assert ask_tree(srv.path)["ok"] is True


def test_start_refuses_to_replace_a_file_that_is_not_a_socket(sock_dir: Path) -> None:
    precious = sock_dir / "a.sock"
    precious.write_text("keep me")
    with pytest.raises(SubagentControlError) as info:
        AdminServer(precious, dump=sample_tree).start()
    assert info.value.code is ErrorCode.INVALID_INPUT
    assert "not a socket" in info.value.message
    assert precious.read_text() == "keep me"
    assert sorted(os.listdir(sock_dir)) == ["a.sock"]


def test_start_refuses_a_path_where_another_server_is_live(server: AdminServer) -> None:
    with pytest.raises(SubagentControlError) as info:
        AdminServer(server.path, dump=sample_tree).start()
    assert info.value.code is ErrorCode.INVALID_INPUT
    assert "another server" in info.value.message
    assert ask_tree(server.path)["ok"] is True


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("missing-dir/a.sock", id="missing-directory"),
        pytest.param("x" * 120, id="long"),
    ],
)
def test_start_refuses_a_path_it_cannot_bind_with_a_clear_error(sock_dir: Path, name: str) -> None:
    with pytest.raises(SubagentControlError) as info:
        AdminServer(sock_dir / name, dump=sample_tree).start()
    assert info.value.code is ErrorCode.INVALID_INPUT
    assert os.listdir(sock_dir) == []


@pytest.mark.parametrize(
    "options",
    [{"max_request_bytes": 0}, {"timeout_s": 0.0}, {"max_connections": 0}],
)
def test_invalid_limits_are_refused(sock_dir: Path, options: dict[str, float]) -> None:
    with pytest.raises(SubagentControlError) as info:
        AdminServer(sock_dir / "a.sock", dump=sample_tree, **options)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_INPUT


def test_many_concurrent_clients_each_get_a_tree_or_busy_and_the_server_survives(
    sock_dir: Path,
) -> None:
    clients = 24
    barrier = threading.Barrier(clients)
    answers: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        barrier.wait(timeout=10)
        # A third of them misbehave: garbage, a half-sent line, an unknown op.
        payload = [b'{"op": "tree"}\n', b"\xff\n", b'{"op": "tr', b'{"op": "kill"}\n'][i % 4]
        try:
            raw = exchange(path, payload, half_close=True)
        except OSError as exc:
            raw = repr(exc).encode()
        with lock:
            answers.append(raw.decode("utf-8", "replace"))

    with AdminServer(sock_dir / "a.sock", dump=sample_tree, max_connections=4) as srv:
        path = srv.path
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(answers) == clients
        for raw in answers:
            reply = json.loads(raw)  # one well-formed reply line each, never a crash
            assert reply["ok"] is True or reply["error"]["code"] in {
                "BUSY",
                "BAD_REQUEST",
                "INCOMPLETE_REQUEST",
                "UNKNOWN_OP",
            }
        assert _eventually(lambda: ask_tree(srv.path)["ok"] is True)
