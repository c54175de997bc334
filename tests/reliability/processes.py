"""Child processes a reliability test drives over pipes: read line by line with a deadline,
told what to do on stdin, and reaped when the test ends, pass or fail.

`Reaper` (the ``reaped`` fixture of a test module) reaps every process added to it, each
even when reaping another one failed. A process's stderr goes to a file, never a pipe: a
chatty process would block on a full pipe nobody reads; its tail is in every failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol, TypeVar

import pytest

from tests.support import WAIT_S

__all__ = ["LINE_S", "REPO", "LinesProcess", "Reaper", "Sender", "reaping"]

REPO = Path(__file__).resolve().parents[2]
LINE_S = WAIT_S * 3
"""How long a test waits for a line a process should print promptly."""
REAP_S = 10.0
STDERR_TAIL = 3000  # characters of stderr in a failure's message


class Reapable(Protocol):
    def reap(self) -> None: ...


P = TypeVar("P", bound=Reapable)


class Reaper:
    """The processes a test started: `add` each as soon as it is made."""

    def __init__(self) -> None:
        self._made: list[Reapable] = []

    def add(self, process: P) -> P:
        """Reap ``process`` when the test ends; returns it."""
        self._made.append(process)
        return process

    def reap_all(self) -> None:
        """Reap every process added, each even if reaping another one raised."""
        with contextlib.ExitStack() as stack:
            for process in self._made:
                stack.callback(process.reap)


def reaping() -> Iterator[Reaper]:
    """A test module's ``reaped`` fixture: ``reaped = pytest.fixture(reaping, name="reaped")``."""
    reaper = Reaper()
    try:
        yield reaper
    finally:
        reaper.reap_all()


class LinesProcess:
    """A script run with this interpreter from the repository, printing lines a test reads.

    A daemon thread reads its stdout to the end (the process's own end, or its reaping).
    `next_line` waits for the next line within a bound, and fails at once, with stderr,
    when the process ended without printing it.

    Args:
        script: The Python script.
        args: Its arguments.
        name: How failures name it.
        stderr: The file its stderr goes to (kept for the test's tmp_path); a temporary file
            by default.
        env: Variables set for it besides ``PYTHONPATH`` (the repository).
        cwd: Its working directory (the repository by default).
        prefix: A command that runs it (``ip netns exec NAME``: in a network namespace);
            it must exec the interpreter, so that the process reaped is the script's.
    """

    def __init__(
        self,
        script: Path,
        *args: str,
        name: str,
        stderr: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.name = name
        # Open for the process's life: `reap` closes it.
        self._err: IO[str] = (
            stderr.open("w+", encoding="utf-8")
            if stderr is not None
            else tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        )
        self._err_tail: str | None = None
        self._lines: list[str] = []
        self._taken = 0
        self._ended = False
        self._cond = threading.Condition()
        try:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, str(script), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                cwd=cwd or REPO,
                text=True,
            )
        except BaseException:
            self._err.close()
            raise
        try:
            threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True).start()
        except BaseException:
            self.reap()
            raise

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            for line in stdout:
                with self._cond:
                    self._lines.append(line.strip())
                    self._cond.notify_all()
        finally:
            stdout.close()
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def lines(self) -> list[str]:
        """Every line it printed so far."""
        with self._cond:
            return list(self._lines)

    def next_line(self, timeout_s: float = LINE_S) -> str:
        """The next line it prints, waited for at most ``timeout_s``."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._lines) > self._taken or self._ended, timeout_s)
            if len(self._lines) == self._taken:
                how = "ended" if self._ended else f"printed nothing for {timeout_s:g} s"
                pytest.fail(f"{self.name} {how} after {self._lines!r}; stderr: {self.stderr()}")
            self._taken += 1
            return self._lines[self._taken - 1]

    def expect(self, prefix: str, timeout_s: float = LINE_S) -> str:
        """The next line, which must start with ``prefix``; the rest of it."""
        line = self.next_line(timeout_s)
        if not line.startswith(prefix):
            pytest.fail(f"{self.name} said {line!r}, not {prefix!r}…; stderr: {self.stderr()}")
        return line.removeprefix(prefix)

    def say(self, line: str) -> None:
        """Write ``line`` to its stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        """The end of what it wrote to stderr."""
        if self._err_tail is not None:  # reaped: the file is closed
            return self._err_tail
        self._err.flush()
        self._err.seek(0)
        return self._err.read()[-STDERR_TAIL:]

    def reap(self) -> None:
        """SIGCONT (in case it is stopped), SIGKILL, and wait for it. Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        try:
            self.proc.wait(REAP_S)
        finally:
            if self._err_tail is None:
                self._err_tail = self.stderr()
                self._err.close()
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):  # a dead reader: the pipe is broken
                    self.proc.stdin.close()


CLAIM_CHILD = Path(__file__).with_name("claim_child.py")


class Sender(LinesProcess):
    """A ``claim_child.py`` runtime sending to one child on cue (``go <round>``)."""

    def __init__(self, url: str, child_id: str, name: str) -> None:
        super().__init__(CLAIM_CHILD, url, child_id, name, name=name)
