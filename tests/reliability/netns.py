"""Faults made by the kernel, not a proxy: PostgreSQL and each runtime in a network
namespace of their own, joined by veth pairs, and faults made with iptables DROP rules,
``ip link set down``, and a relay that delays every byte.

A proxy that holds bytes hides what the kernel does: a packet dropped (not held) leaves
the connection half-open, the sender's TCP retransmits it with a growing backoff (a
renewal sent into a partition arrives long after the link is back), and a connect's SYN
is retried after 1 s, then 3 s. This harness makes those faults for real.

Traffic goes only to addresses inside the namespaces a test made: the store's namespace
(``<tag>-db``) and one per runtime (``<tag>-r<i>``), runtime ``i`` joined to the store by
its own veth pair on ``10.236.<i>.0/30`` (the store ``.1``, the runtime ``.2``), nothing
routed anywhere else. The test itself (in the host's namespace) reaches the server only
through its Unix socket, a file. Everything is torn down when the block ends, pass or
fail (deleting a namespace deletes its veth ends and its rules).

This kernel has no ``netem`` qdisc, so latency comes from `DelayRelay`, a relay of the
harness's own in the store's namespace.

Needs root, ``ip`` (iproute2), ``iptables``, and PostgreSQL's server binaries; a test
skips with the reason when one is missing (`skip_reason`). ``.ci/run`` installs iptables.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.reliability.pg_fault import pg_binaries

__all__ = ["DelayRelay", "Namespaces", "NsPostgres", "Runtime", "kernel_faults", "skip_reason"]

_START_S = 30.0
_SUBNET = "10.236"
RELAY = Path(__file__).with_name("delay_relay.py")


def skip_reason() -> str | None:
    """Why the kernel-fault harness cannot run here, or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "iptables", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs iptables with apt)"
    if pg_binaries() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    probe = f"sa36p{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    try:
        rule = _ip_run(probe, "iptables", "-A", "OUTPUT", "-d", "10.236.255.1", "-j", "DROP")
        if rule.returncode != 0:
            return f"iptables cannot add a DROP rule: {rule.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip_run(namespace: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", namespace, *command],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.strip()}")


def _mac(namespace: str, device: str) -> str:
    shown = subprocess.run(
        ["ip", "-n", namespace, "-j", "link", "show", "dev", device],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    _check(shown, f"ip -n {namespace} link show dev {device}")
    return str(json.loads(shown.stdout)[0]["address"])


def _ip(*args: str) -> None:
    _check(
        subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=False),
        "ip " + " ".join(args),
    )


@dataclass(frozen=True)
class Runtime:
    """A runtime's namespace and its link to the store's."""

    index: int
    namespace: str
    device: str
    """Its veth end (in its namespace)."""
    store_address: str
    """The store's end of its link, the address it reaches PostgreSQL at."""
    store_mac: str
    """The store's end's hardware address, a permanent neighbour of the runtime's end."""

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a process in its namespace."""
        return ["ip", "netns", "exec", self.namespace]


class Namespaces:
    """The store's namespace and the runtimes', made by `add_runtime`; `close` removes
    every one (with its veths and rules)."""

    def __init__(self) -> None:
        self.tag = f"sa36{uuid.uuid4().hex[:5]}"
        self.store = f"{self.tag}-db"
        self._made: list[str] = []
        self.runtimes: list[Runtime] = []
        self._make(self.store)

    def _make(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")

    def add_runtime(self) -> Runtime:
        """A new runtime namespace, linked to the store's on its own /30."""
        index = len(self.runtimes)
        namespace = f"{self.tag}-r{index}"
        self._make(namespace)
        store_end, runtime_end = f"{self.tag}s{index}", f"{self.tag}r{index}"
        _ip(
            "link", "add", store_end, "netns", self.store, "type", "veth",
            "peer", "name", runtime_end, "netns", namespace,
        )  # fmt: skip
        net = f"{_SUBNET}.{index}"
        _ip("-n", self.store, "addr", "add", f"{net}.1/30", "dev", store_end)
        _ip("-n", namespace, "addr", "add", f"{net}.2/30", "dev", runtime_end)
        _ip("-n", self.store, "link", "set", store_end, "up")
        _ip("-n", namespace, "link", "set", runtime_end, "up")
        # Each end knows the other's hardware address for good: no ARP on this link (see
        # `link`). The store's entry outlives the runtime's end going down (a carrier
        # change keeps permanent neighbours); the runtime's is written again at each up.
        store_mac, runtime_mac = _mac(self.store, store_end), _mac(namespace, runtime_end)
        _ip("-n", self.store, "neigh", "replace", f"{net}.2", "lladdr", runtime_mac,
            "dev", store_end, "nud", "permanent")  # fmt: skip
        runtime = Runtime(index, namespace, runtime_end, f"{net}.1", store_mac)
        self._know_store(runtime)
        self.runtimes.append(runtime)
        return runtime

    @staticmethod
    def _know_store(runtime: Runtime) -> None:
        _ip("-n", runtime.namespace, "neigh", "replace", runtime.store_address, "lladdr",
            runtime.store_mac, "dev", runtime.device, "nud", "permanent")  # fmt: skip

    # -- faults ---------------------------------------------------------------------------

    def drop(self, runtime: Runtime, *, outgoing: bool = True, incoming: bool = True) -> None:
        """Drop the runtime's packets to the store (``outgoing``) and the store's to it
        (``incoming``), in the runtime's namespace: connections stay open, nothing passes."""
        for chain, flag, wanted in (("OUTPUT", "-d", outgoing), ("INPUT", "-s", incoming)):
            if wanted:
                rule = [chain, flag, runtime.store_address, "-j", "DROP"]
                added = _ip_run(runtime.namespace, "iptables", "-A", *rule)
                _check(added, f"drop {chain} in {runtime.namespace}")

    def heal(self, runtime: Runtime) -> None:
        """Remove every DROP rule of the runtime's namespace."""
        for chain in ("OUTPUT", "INPUT"):
            _check(_ip_run(runtime.namespace, "iptables", "-F", chain), f"flush {chain}")

    def link(self, runtime: Runtime, *, up: bool) -> None:
        """Set the runtime's end of its link down or up (``ip link set``).

        The link is down for as long as it is set down, not longer. With ARP on the link
        it could be down for up to two seconds more: setting an end down flushes its
        neighbours, so after the up the first packet waits on an ARP request, and a reply
        lost while the other end's carrier comes back is asked again only a second later
        (seen: a flap of 1 s down and 1 s up in which no packet of the runtime's reached
        the wire for the whole up second, a 3 s outage). So the neighbours are permanent
        (`add_runtime`), the runtime's written again at once after each up.
        """
        _ip("-n", runtime.namespace, "link", "set", runtime.device, "up" if up else "down")
        if up:
            self._know_store(runtime)

    def close(self) -> None:
        """Delete every namespace made here (their veths and rules go with them)."""
        failures = []
        for namespace in reversed(self._made):
            result = subprocess.run(
                ["ip", "netns", "del", namespace], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                failures.append(f"{namespace}: {result.stderr.strip()}")
        self._made.clear()
        if failures:
            raise RuntimeError(f"could not delete network namespaces: {failures}")


class NsPostgres:
    """A private PostgreSQL server in the store's namespace, listening on every address of
    that namespace (its loopback and the store's end of each runtime's link) and on a Unix
    socket in its private directory, which the test reaches it by."""

    def __init__(self, namespace: str) -> None:
        bin_dir = pg_binaries()
        assert bin_dir is not None
        self._bin = bin_dir
        self._namespace = namespace
        self.port = 5432  # the namespace's own: nothing else listens there
        self._root = Path(tempfile.mkdtemp(prefix="subagent-nspg-"))
        self.data = self._root / "data"
        self.log = self._root / "server.log"
        shutil.chown(self._root, user="postgres", group="postgres")
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync",
            "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '*'\n"
                f"unix_socket_directories = '{self._root}'\n"
                "max_connections = 300\nfsync = off\nfull_page_writes = off\n"
                "shared_buffers = 32MB\nlog_min_messages = warning\n"
                # Lock waits past a second, with the holder (see `pg_fault`).
                "log_lock_waits = on\nlog_line_prefix = '%m [%p] %r '\n"
            )
        with (self.data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
            hba.write(f"\nhost all all {_SUBNET}.0.0/16 trust\n")  # the runtimes' links
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(_START_S)),
            "start",
        )  # fmt: skip

    def socket_url(self, database: str) -> str:
        """The database's URL through the Unix socket (for the test, outside every
        namespace)."""
        return f"postgresql+psycopg://postgres@/{database}?host={self._root}&port={self.port}"

    def url_for(self, runtime: Runtime, database: str, *, port: int | None = None) -> str:
        """The database's URL as a runtime reaches it over its link (through a relay
        listening on ``port`` of the store's end, if given)."""
        return (
            f"postgresql+psycopg://postgres@{runtime.store_address}:{port or self.port}/{database}"
        )

    def new_database(self) -> str:
        """A fresh database; its name."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        import psycopg

        with psycopg.connect(
            f"host={self._root} port={self.port} user=postgres dbname=postgres",
            autocommit=True, connect_timeout=5,
        ) as conn:  # fmt: skip
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def close(self, keep: Path | None = None) -> None:
        """Stop the server (immediately) and remove its directory, its log copied into
        the folder ``keep`` first, if given."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            if keep is not None and self.log.exists():
                shutil.copy(self.log, keep / "server.log")
            shutil.rmtree(self._root, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        command = [
            "ip", "netns", "exec", self._namespace,
            "runuser", "-u", "postgres", "--", str(self._bin / tool), *args,
        ]  # fmt: skip
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=2 * _START_S,
            cwd=self._root,
        )  # fmt: skip
        if result.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed: {result.stderr.strip()[-2000:]}; log: {tail}")


class DelayRelay:
    """A TCP relay in the store's namespace that holds every chunk ``delay_s`` before it
    passes it on, each way: latency on one runtime's link (this kernel has no netem)."""

    def __init__(self, runtime: Runtime, store_namespace: str, target_port: int, delay_s: float):
        self.port = 6000 + runtime.index
        self.proc = subprocess.Popen(
            [
                "ip", "netns", "exec", store_namespace, sys.executable, str(RELAY),
                runtime.store_address, str(self.port), "127.0.0.1", str(target_port),
                str(delay_s),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("relaying"):
            self.close()
            raise RuntimeError(f"the delay relay did not start: {line!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def kernel_faults(
    runtimes: int, *, keep: Path | None = None
) -> Iterator[tuple[Namespaces, NsPostgres]]:
    """The store's namespace with its server and ``runtimes`` runtime namespaces; all torn
    down when the block ends, pass or fail (the server's log copied into the folder
    ``keep`` first, if given)."""
    spaces = Namespaces()
    server: NsPostgres | None = None
    try:
        for _ in range(runtimes):
            spaces.add_runtime()
        server = NsPostgres(spaces.store)
        yield spaces, server
    finally:
        try:
            if server is not None:
                server.close(keep)
        finally:
            spaces.close()
