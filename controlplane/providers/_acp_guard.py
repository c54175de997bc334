"""A watchdog process per ACP agent: its process group dies with the process that started it.

An ACP agent runs in a session (and process group) of its own, so that it can be ended
whole: it, a wrapper it runs under (Codex's ACP adapter is a node process that spawns the
real agent) and whatever they spawned. `reap` ends that group on every way out of a run
that this process lives through. This module covers the one it does not live through: a
harness SIGKILLed (or crashed, or exited without ``close()``) mid-turn leaves no one to
signal the group, and an agent that does not exit when its stdin closes — or its
grandchildren, which never saw that stdin — would run on for good.

So each agent gets a guard: a small shell process, in a session of its own (a Ctrl-C to
the harness's terminal does not reach it), started before the agent, that holds the read
end of a pipe whose only writer is this process. The run tells it the agent's process
group once spawned (``+ PGID``) and releases it after reaping the agent (``-``). End of
file without a release means this process is gone: the guard sends the group SIGTERM,
then SIGKILL after the grace period, and exits. The kernel closes the pipe however this
process dies, so the cleanup does not depend on it, nor on the store, nor on another
runtime coming along.

Why not the alternatives the issue names:

- ``PR_SET_PDEATHSIG`` on the agent reaches the agent only (not its wrapper's child, not
  its grandchildren), fires when the *thread* that forked it exits rather than the process,
  and needs a ``preexec_fn``, which is unsafe in a threaded program such as this one.
- Recording the group durably with the activation (host, boot id, pgid, the leader's start
  time) and having a takeover or a sweep kill it works only when another runtime on the
  same host comes along, up to twice ``lease_ttl_s`` later, and needs schema changes. The
  guard ends the group within the grace period, whoever comes along.

Against pid reuse the guard notes the group leader's start time (``/proc/PID/stat``) when
it is told the group, and kills nothing if another process holds that pid later. A leader
that is gone while members live cannot have its id reused (the kernel keeps an id while
any process uses it as its group), so the group is still the agent's. What escapes the
guard: a process the agent moved to another session (``setsid``), and a harness killed in
the instant between spawning the agent and telling its guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

__all__ = ["GroupGuard"]

# POSIX sh: it starts in ~1 ms, where a Python guard's ~20 ms start-up competed with the
# agent's own for the CPU on every start. Field 22 of /proc/PID/stat is the start time: the
# 20th after the ") " that ends the command name. Standard error goes nowhere.
_GUARD = r"""
grace_ticks=$1
started_of() {
    stat=
    read -r stat 2>/dev/null < "/proc/$1/stat" || return 0
    set -- ${stat##*) }
    echo "${20}"
}
group=
while read -r op pgid; do
    case $op in
        +) group=$pgid; started=$(started_of "$pgid") ;;
        -) group= ;;
    esac
done
[ -n "$group" ] || exit 0
now=$(started_of "$group")
[ -z "$started" ] || [ -z "$now" ] || [ "$now" = "$started" ] || exit 0
kill -s TERM -- "-$group" 2>/dev/null || exit 0
ticks=0
while kill -s 0 -- "-$group" 2>/dev/null && [ "$ticks" -lt "$grace_ticks" ]; do
    sleep 0.05
    ticks=$((ticks + 1))
done
kill -s KILL -- "-$group" 2>/dev/null
exit 0
"""
_TICK_S = 0.05


class GroupGuard:
    """The guard of one agent's process group (see the module docstring)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, grace_s: float) -> GroupGuard:
        """Start a guard that will give the group ``grace_s`` between SIGTERM and SIGKILL."""
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", _GUARD, "guard", str(math.ceil(grace_s / _TICK_S)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        return cls(process)

    def watch(self, pgid: int) -> None:
        """Guard process group ``pgid`` from now on."""
        self._say(f"+ {pgid}\n")

    async def release(self, timeout_s: float) -> None:
        """Stand the guard down (the group was reaped) and wait for it to exit."""
        self._say("-\n")
        stdin = self._process.stdin
        if stdin is not None:
            with contextlib.suppress(Exception):
                stdin.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._process.wait()), timeout_s)
        except TimeoutError:  # cannot happen short of a stopped guard; never leave it
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()

    def _say(self, line: str) -> None:
        stdin = self._process.stdin
        if stdin is not None:
            # A few bytes into an empty pipe: never blocks. A guard that died (nothing but a
            # deliberate kill does that) leaves the group to `reap` alone.
            with contextlib.suppress(Exception):
                stdin.write(line.encode())
