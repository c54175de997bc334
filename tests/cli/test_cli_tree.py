"""`subagent-control tree`: the live tree over the admin socket, and every way it can fail."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import ActorTree
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_ERROR_REPLY, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from controlplane.runtime._admin import AdminServer
from tests.cli.cli_support import sample_tree, start_ready_process, stop_process
from tests.support import run_python


@pytest.fixture
def server(sock_dir: Path) -> Iterator[AdminServer]:
    with AdminServer(sock_dir / "admin.sock", dump=sample_tree) as srv:
        yield srv


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_tree_prints_the_rendered_tree(
    server: AdminServer, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "tree", "--socket", server.path)
    assert (status, err) == (EXIT_OK, "")
    assert out == sample_tree().render() + "\n"
    assert "supervisor child-busy [running]" in out
    assert "activation task-7 (resumed, published, running" in out


def test_tree_json_parses_back_into_the_same_actor_tree(
    server: AdminServer, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "tree", "--socket", server.path, "--json")
    assert status == EXIT_OK
    assert ActorTree.model_validate_json(out) == sample_tree()


def test_tree_reads_a_real_process_started_by_the_test(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(sock_dir / "admin.sock")
    proc = start_ready_process(["-m", "tests.cli.serve_fake_tree", path])
    try:
        status, out, _ = run(capsys, "tree", "--socket", path, "--json")
        assert status == EXIT_OK
        assert ActorTree.model_validate_json(out) == sample_tree()
        # The module entry point too, as an operator's shell would run it.
        cli = run_python("-m", "controlplane.cli", "tree", "--socket", path, timeout=60)
        assert (cli.returncode, cli.stderr) == (EXIT_OK, "")
        assert cli.stdout == sample_tree().render() + "\n"
    finally:
        assert stop_process(proc) == 0
    assert not os.path.exists(path)  # the process removed its socket on the way out


def test_tree_on_a_missing_socket_exits_unreachable_with_a_clear_message(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "tree", "--socket", str(sock_dir / "nope.sock"))
    assert (status, out) == (EXIT_UNREACHABLE, "")
    assert "no admin socket at" in err
    assert "Traceback" not in err


def test_tree_on_a_refused_connection_exits_unreachable_with_a_clear_message(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_dir / "stale.sock"))
    stale.close()  # the file stays; nobody accepts on it
    status, _, err = run(capsys, "tree", "--socket", str(sock_dir / "stale.sock"))
    assert status == EXIT_UNREACHABLE
    assert "connection refused" in err


def test_tree_on_a_file_that_is_not_a_socket_exits_unreachable(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (sock_dir / "plain").write_text("hello")
    status, _, err = run(capsys, "tree", "--socket", str(sock_dir / "plain"))
    assert status == EXIT_UNREACHABLE
    assert "is not a socket" in err


def test_tree_gives_up_on_a_socket_that_never_answers(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(sock_dir / "mute.sock"))
        mute.listen(1)  # connects succeed through the backlog; nothing ever replies
        status, _, err = run(
            capsys, "tree", "--socket", str(sock_dir / "mute.sock"), "--timeout", "0.2"
        )
    assert status == EXIT_UNREACHABLE
    assert "no reply" in err


def test_tree_gives_up_on_a_socket_whose_backlog_stays_full(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fillers: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as jammed:
        jammed.bind(str(sock_dir / "jammed.sock"))
        jammed.listen(0)  # never accepts: the backlog fills after a connection or two
        try:
            for _ in range(100):
                filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                fillers.append(filler)
                filler.setblocking(False)
                try:
                    filler.connect(str(sock_dir / "jammed.sock"))
                except BlockingIOError:
                    break
            else:
                pytest.fail("the backlog never filled")
            status, _, err = run(
                capsys, "tree", "--socket", str(sock_dir / "jammed.sock"), "--timeout", "0.2"
            )
        finally:
            for filler in fillers:
                filler.close()
    assert status == EXIT_UNREACHABLE
    assert "overloaded" in err


def test_tree_exits_with_the_error_reply_code_when_the_dump_fails(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def dump() -> ActorTree:
        raise RuntimeError("the root actor is gone")

    with AdminServer(sock_dir / "a.sock", dump=dump) as srv:
        status, out, err = run(capsys, "tree", "--socket", srv.path)
    assert (status, out) == (EXIT_ERROR_REPLY, "")
    assert "[DUMP_FAILED]" in err
    assert "the root actor is gone" in err


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"hello\n", id="not-json"),
        pytest.param(b'{"ok": true, "tree": {"closed": "maybe"}}\n', id="not-a-tree"),
        pytest.param(b"", id="closed-without-reply"),
    ],
)
def test_tree_exits_with_the_error_reply_code_when_the_answer_is_not_a_tree(
    sock_dir: Path, capsys: pytest.CaptureFixture[str], reply: bytes
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as impostor:
        impostor.bind(str(sock_dir / "i.sock"))
        impostor.listen(1)

        def answer() -> None:
            conn, _ = impostor.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(reply)

        responder = threading.Thread(target=answer, daemon=True)
        responder.start()
        status, _, err = run(capsys, "tree", "--socket", str(sock_dir / "i.sock"))
        responder.join(timeout=10)
    assert status == EXIT_ERROR_REPLY
    assert err.startswith("subagent-control: ")
    assert "Traceback" not in err


def test_the_top_level_help_documents_the_exit_codes_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "--help")
    assert status == EXIT_OK
    assert out.count("exit status:") == 1
    assert "4  unreachable" in out


@pytest.mark.parametrize("command", ["tree", "children", "transcript", "send", "mcp"])
def test_a_command_s_help_points_to_the_exit_codes_instead_of_repeating_them(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    status, out, _ = run(capsys, command, "--help")
    assert status == EXIT_OK
    assert "exit status: see subagent-control --help" in out
    assert "4  unreachable" not in out


@pytest.mark.parametrize(
    "argv",
    [[], ["tree"], ["frobnicate"], ["tree", "--socket", "x", "--timeout", "-1"]],
)
def test_usage_errors_exit_with_the_usage_code(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    status, out, err = run(capsys, *argv)
    assert (status, out) == (EXIT_USAGE, "")
    assert "usage:" in err


@pytest.fixture
def misbehaving_server(sock_dir: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A real process serving the admin socket in the mode the test is parametrized with
    (`tests.cli.serve_fake_tree`); reaped pass or fail."""
    path = str(sock_dir / "admin.sock")
    proc = start_ready_process(["-m", "tests.cli.serve_fake_tree", path, request.param])
    try:
        yield path
    finally:
        stop_process(proc)


@pytest.mark.parametrize("misbehaving_server", ["trickle"], indirect=True)
def test_tree_timeout_is_a_deadline_for_the_whole_reply_not_for_each_read(
    misbehaving_server: str,
) -> None:
    # A byte every 0.4 s: every read succeeds well within 1 s, the reply never ends.
    started = time.monotonic()
    cli = run_python(
        "-m", "controlplane.cli", "tree", "--socket", misbehaving_server, "--timeout", "1",
        timeout=40,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert (cli.returncode, cli.stdout) == (EXIT_UNREACHABLE, ""), cli.stderr
    assert "no reply" in cli.stderr
    assert "within 1.0s" in cli.stderr
    assert "Traceback" not in cli.stderr
    # The interpreter's start-up is in there too (seconds on a loaded machine); a per-read
    # timeout would run into the subprocess timeout instead.
    assert elapsed < 30


@pytest.mark.parametrize("misbehaving_server", ["deep"], indirect=True)
def test_tree_on_a_deeply_nested_reply_exits_with_the_error_reply_code_and_no_traceback(
    misbehaving_server: str,
) -> None:
    cli = run_python("-m", "controlplane.cli", "tree", "--socket", misbehaving_server, timeout=60)
    assert (cli.returncode, cli.stdout) == (EXIT_ERROR_REPLY, ""), cli.stderr
    assert cli.stderr.startswith("subagent-control: ")
    assert "nested" in cli.stderr
    assert "Traceback" not in cli.stderr
