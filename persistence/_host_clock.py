"""The clocks a lease is judged on: the database's on PostgreSQL, and on SQLite the
host's boot clock, which every process of the host shares.

SQLite runs on one host, but every process there reads its own wall clock: a clock
stepped by minutes (NTP catching up, a container with a faked clock, an administrator) would
make one process see another's fresh heartbeat as lapsed and take its live child over. The wall
clock also steps backwards and jumps across a suspend. ``CLOCK_BOOTTIME`` does neither: it is
the kernel's count of seconds since boot (suspend included), the same for every process on
the host, and never set. It only means something with its boot, so a heartbeat records the
kernel's boot id with it; a lease written under another boot id on this host was written
before a reboot, and its process is gone. Where there is no boot clock or boot id (not
Linux), SQLite leases fall back to the wall clock.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from controlplane.contract import RuntimeInfo

__all__ = ["LeaseNow", "boot_id", "boot_seconds", "host_name", "is_expired"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def host_name() -> str:
    """This host's name as a runtime's row records it."""
    return socket.gethostname()[:255]


def boot_id() -> str | None:
    """The kernel's id of this boot (Linux), or None."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def boot_seconds() -> float | None:
    """``CLOCK_BOOTTIME`` now (seconds since this host booted), or None where there is none."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return time.clock_gettime(clock)


@dataclass(frozen=True, slots=True)
class LeaseNow:
    """The present, as leases are judged by it.

    Attributes:
        wall: The database's clock (PostgreSQL) or this host's wall clock (SQLite).
        host: This host's name, where ``boot`` applies.
        boot: This host's boot id and boot clock (SQLite on Linux); None: the wall only.
    """

    wall: datetime
    host: str | None = None
    boot: tuple[str, float] | None = None

    @classmethod
    def here(cls, wall: datetime) -> LeaseNow:
        """Now on this host, its boot clock included where it has one (SQLite)."""
        ident, seconds = boot_id(), boot_seconds()
        boot = None if ident is None or seconds is None else (ident, seconds)
        return cls(wall=wall, host=host_name(), boot=boot)


def is_expired(runtime: RuntimeInfo, now: LeaseNow | datetime) -> bool:
    """Whether a runtime is dead to everyone: closed, or its lease lapsed (on the boot clock
    when it and ``now`` were read on one boot of one host; before a reboot of this host,
    lapsed; otherwise on the wall clock)."""
    if runtime.closed_at is not None:
        return True
    if isinstance(now, datetime):
        now = LeaseNow(wall=now)
    if now.boot is not None and runtime.boot_id is not None:
        ident, seconds = now.boot
        if runtime.boot_id == ident and runtime.heartbeat_boot_s is not None:
            return runtime.heartbeat_boot_s + runtime.lease_ttl_s < seconds
        if runtime.boot_id != ident and runtime.host == now.host:
            return True  # written before this host's last reboot
    return runtime.heartbeat_at + timedelta(seconds=runtime.lease_ttl_s) < now.wall
