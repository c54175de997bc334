"""The store's bad days, made on purpose: a PostgreSQL server a test starts, crashes and
restarts itself, a TCP proxy that partitions or resets the way to it, and a lock probe that
catches two activations of one child at once.

Never the shared server on 5432: `PostgresServer` runs its own cluster (``initdb`` and
``pg_ctl`` from ``/usr/lib/postgresql/*/bin``, as the ``postgres`` user through ``runuser``
when the tests run as root) in a private data directory on a private port, and removes it
when the test module ends. ``fsync`` is off (a crash here is the server's, not the
machine's: what a process wrote to the kernel survives ``pg_ctl stop -m immediate``), while
``synchronous_commit`` stays on, so a commit the server acknowledged survives its crash as
it would in production.

`TcpProxy` sits between a runtime and the server. ``hold()`` is a partition: connections
stay open and new ones are accepted, but no byte passes either way until ``release()``. The
proxy's own kernel still acknowledges what it receives, so TCP keepalives and
``tcp_user_timeout`` see a live peer behind a held proxy: only a deadline the client keeps
itself ends a call that waits for an answer. ``reset()`` ends every open connection with a
RST (what a failover or a NAT that forgot the flow does).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import sqlalchemy as sa

__all__ = [
    "LockProbe",
    "PostgresServer",
    "TcpProxy",
    "pg_binaries",
    "pg_server",
    "tcp_proxy_factory",
]

_START_S = 30.0  # pg_ctl's own wait for a start, and ours for the server to accept
_STOP_S = 30.0
_POLL_S = 0.05


def pg_binaries() -> Path | None:
    """The newest PostgreSQL server's ``bin`` folder, or None when there is none."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _major(p.parent.name))
    usable = [b for b in found if (b / "initdb").exists() and (b / "pg_ctl").exists()]
    return usable[-1] if usable else None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A private PostgreSQL server: its own cluster, data directory and port.

    Args:
        bin_dir: The server's binaries (`pg_binaries`).
        max_connections: The server's ``max_connections`` (stress runs open many).
    """

    def __init__(self, bin_dir: Path, *, max_connections: int = 300) -> None:
        self._bin = bin_dir
        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        self.port = _free_port()
        self._root = Path(tempfile.mkdtemp(prefix="subagent-pg-"))
        self.data = self._root / "data"
        self.log = self._root / "server.log"
        if self._as_postgres:
            shutil.chown(self._root, user="postgres", group="postgres")
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync",
            "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self._root}'\n"
                f"max_connections = {max_connections}\nfsync = off\n"
                "full_page_writes = off\nshared_buffers = 32MB\n"
                "log_min_messages = warning\n"
                # A lock wait past a second is logged with the process that holds the
                # lock and its statement: who kept a child's lock through a fault.
                "log_lock_waits = on\nlog_line_prefix = '%m [%p] %r '\n"
            )
        self.start()

    @property
    def admin_url(self) -> str:
        """A URL of the server's ``postgres`` database, for the test's own SQL."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh database on this server; its SQLAlchemy URL."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
            autocommit=True, connect_timeout=5,
        ) as conn:  # fmt: skip
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        """Start the server and return once it accepts connections."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(_START_S)),
            "start",
        )  # fmt: skip
        self._wait(up=True)

    def crash(self) -> None:
        """Stop the server the way a crash does (``pg_ctl stop -m immediate``): no
        checkpoint, every connection cut; it recovers from its WAL at the next start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self._wait(up=False)

    def restart(self, down_s: float) -> None:
        """Crash, stay down ``down_s`` seconds, start again (returns once it accepts)."""
        self.crash()
        time.sleep(down_s)  # the outage itself, not a synchronisation
        self.start()

    def is_up(self) -> bool:
        """Whether the server accepts connections now."""
        result = subprocess.run(
            [str(self._bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
            check=False, timeout=10,
        )  # fmt: skip
        return result.returncode == 0

    def close(self) -> None:
        """Stop the server (immediately) and remove its data directory."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    def _wait(self, *, up: bool) -> None:
        deadline = time.monotonic() + _START_S
        while self.is_up() != up:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL on port {self.port} is still {'down' if up else 'up'} after "
                    f"{_START_S:g} s; its log: {self._log_tail()}"
                )
            time.sleep(_POLL_S)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self._bin / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=_STOP_S + _START_S,
            cwd=self._root,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip()[-2000:]}; "
                f"server log: {self._log_tail()}"
            )


def _skip_reason() -> str | None:
    if pg_binaries() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (initdb, pg_ctl)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: initdb cannot run as the postgres user"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run initdb as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (the postgres extra)"
    return None


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the test module, crashed and restarted at will."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(f"cannot start a private PostgreSQL server: {reason}")
    bin_dir = pg_binaries()
    assert bin_dir is not None
    server = PostgresServer(bin_dir)
    try:
        yield server
    finally:
        server.close()


# -- the proxy ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket
    closed: bool = False
    threads: list[threading.Thread] = field(default_factory=list)


class TcpProxy:
    """A TCP relay on loopback to ``127.0.0.1:target_port`` that a test can partition
    (`hold`) or reset.

    Args:
        target_port: The server's port.
    """

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self.connections = 0
        """How many connections the proxy accepted so far."""
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        return (
            sa.make_url(url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def hold(self) -> None:
        """Partition: every connection stays open, none passes a byte either way."""
        self._flowing.clear()

    def release(self) -> None:
        """End the partition: what was held passes now, in order."""
        self._flowing.set()

    @property
    def holding(self) -> bool:
        """Whether the proxy holds the bytes now."""
        return not self._flowing.is_set()

    def reset(self) -> None:
        """End every open connection with a RST, both ways."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._drop(pair, rst=True)

    def close(self) -> None:
        """Stop accepting, reset every connection, end the proxy's threads."""
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):  # wakes the blocked accept(); close() alone doesn't
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()
        self._acceptor.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._abort(client)
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                if self._closed.is_set():
                    self._drop(pair, rst=True)
                    return
                self._pairs.append(pair)
                self.connections += 1
            for src, dst, name in ((client, upstream, "up"), (upstream, client, "down")):
                thread = threading.Thread(
                    target=self._pump, args=(pair, src, dst), name=f"proxy-{name}", daemon=True
                )
                pair.threads.append(thread)
                thread.start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            # Held: the bytes just read wait here (and nothing more is read) until released.
            while not self._flowing.wait(_POLL_S):
                if pair.closed:
                    return
            if not data or pair.closed:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        self._drop(pair, rst=False)

    def _drop(self, pair: _Pair, *, rst: bool) -> None:
        if pair.closed:
            return
        pair.closed = True
        for sock in (pair.client, pair.upstream):
            if rst:
                self._abort(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _abort(sock: socket.socket) -> None:
        # SO_LINGER on, zero seconds: close() sends a RST instead of a FIN. Only the read
        # side is shut first (it sends nothing, and wakes this proxy's pump blocked in recv
        # on it): SHUT_RDWR would send a FIN ahead of the RST, and a peer that reads the FIN
        # first sees a clean end of stream, not a reset.
        with contextlib.suppress(OSError):
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)
        with contextlib.suppress(OSError):
            sock.close()


@pytest.fixture
def tcp_proxy_factory() -> Iterator[Callable[[int], TcpProxy]]:
    """Makes `TcpProxy` instances, every one closed when the test ends."""
    made: list[TcpProxy] = []

    def make(target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_port)
        made.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in made:
            proxy.close()


# -- the lock probe ------------------------------------------------------------------------


class LockProbe:
    """Catches two activations of one child acting at once, across threads and processes.

    An activation calls `enter` when it starts acting and `exit` when it stops; each takes
    (or gives back) a non-blocking exclusive ``flock`` on the child's file in ``directory``.
    A lock already held means another activation of that child is acting: that is recorded
    as a line of ``violations.log``, which every process appends to.

    Args:
        directory: A folder every process of the test can write.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, IO[bytes]] = {}
        self._lock = threading.Lock()

    def enter(self, child_id: str, who: str = "") -> bool:
        """Take the child's lock; False (and a recorded violation) if it is held."""
        handle = (self.directory / f"{child_id}.lock").open("ab")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            self._record(f"{child_id} entered by {who or os.getpid()} while held")
            return False
        with self._lock:
            self._held[child_id] = handle
        return True

    def exit(self, child_id: str) -> None:
        """Give the child's lock back (a no-op if this probe does not hold it)."""
        with self._lock:
            handle = self._held.pop(child_id, None)
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    def violations(self) -> list[str]:
        """Every violation any process recorded."""
        try:
            text = (self.directory / "violations.log").read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line]

    def _record(self, line: str) -> None:
        # O_APPEND writes of one short line are atomic across processes.
        fd = os.open(self.directory / "violations.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
