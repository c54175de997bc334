"""What the numbers were measured on: machine, interpreter, library versions, date."""

from __future__ import annotations

import os
import platform
import sqlite3
from datetime import UTC, datetime
from importlib import metadata

__all__ = ["load_average", "machine_lines"]

_PACKAGES = (
    "pykka",
    "pydantic",
    "SQLAlchemy",
    "psycopg",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint",
    "openai-agents",
)


def machine_lines(pg_version: str | None = None) -> list[str]:
    """Markdown bullet lines describing this machine and run."""
    versions = ", ".join(f"{name} {_version(name)}" for name in _PACKAGES)
    lines = [
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {_cpu_model()}, nproc {_nproc()}, {_memory()}; {platform.platform()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"SQLite {sqlite3.sqlite_version}" + (f", PostgreSQL {pg_version}" if pg_version else ""),
        f"- Libraries: {versions}",
        f"- CPU idle governor: {_idle_governor()} (how fast a sleeping thread's CPU wakes)",
    ]
    return lines


def _idle_governor() -> str:
    try:
        with open("/sys/devices/system/cpu/cpuidle/current_governor", encoding="ascii") as f:
            governor = f.read().strip()
    except OSError:
        return "unknown"
    if governor == "haltpoll":
        return "haltpoll, a KVM guest: an idle vCPU polls briefly, then halts"
    return governor


def load_average() -> str:
    """The 1-minute load average now (other work on the machine adds noise)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            return loadavg.read().split()[0]
    except OSError:
        return "?"


def _nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return f"{kib / 1024 / 1024:.0f} GiB RAM"
    except OSError:
        pass
    return "unknown RAM"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
