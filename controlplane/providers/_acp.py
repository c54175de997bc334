"""`AcpProvider`: each activation drives an Agent Client Protocol agent in a subprocess.

One activation is one agent process, spoken to over stdio with the ``agent-client-protocol``
package (the optional ``acp`` extra, imported when the provider is built), on an asyncio
loop in a thread of the run's own. `start` returns once the prompt is on its way, so a
failure to spawn, initialize or open the session fails the start with the agent's own
words and leaves no child behind; after that the run's result is the prompt's.

The session methods used are those the agent advertises (`_acp_session`): a resume is
``session/resume``, else ``session/load``, else a new session primed with the transcript; a
run ends with ``session/close``; a running turn takes steered messages through the
``_session/steering`` extension. A steer waits for the agent's answer under the child's
transcript lock, so the agent's updates are written on a writer thread of the run's own,
never on the loop that must read that answer.

A turn outlives its runtime when the agent can reopen its session: its agent process died
with the runtime (a crash, a SIGKILL, a lost lease) or was stopped by ``close()``, and the
runtime that carries the Task on starts a new agent process, reopens the recorded session
(``session/resume``, else ``session/load``) and sends the turn's messages again, in the
same turn (`AcpProvider.recovery_refusal` says beforehand whether it can).

Kill: ``session/cancel``; if the agent does not end its prompt within the grace period, the
prompt is abandoned. Then, on every way out of the run (answered, cancelled, failed), the
session is closed (bounded by the grace period; not after an abandoned prompt) and the agent
is reaped: EOF on its stdin, SIGTERM to its whole process group promptly after, and SIGKILL
after the grace period (`_acp_client.reap`). Once reaping began nothing interrupts it: a
kill or a cancellation that lands meanwhile cannot skip a signal. A harness that dies
without reaping leaves the group to its guard (`controlplane.providers._acp_guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controlplane.contract import (
    AgentHandle,
    CancelSignal,
    ErrorCode,
    MessageSource,
    ResumeRequest,
    SessionEvent,
    StartRequest,
    StopReason,
    SubagentControlError,
    SubagentResult,
    TextBlock,
    text_of,
)
from controlplane.providers._acp_client import (
    AcpRecorder,
    PermissionPolicy,
    StderrTail,
    reap,
    spawn,
    stop_reason_of,
)
from controlplane.providers._acp_guard import GroupGuard
from controlplane.providers._acp_session import (
    SETTLED,
    Capabilities,
    SteerWaiter,
    close_session,
    open_session,
    recovery_refusal,
    steer_session,
)
from controlplane.providers._agent_loop import start_cancelled
from controlplane.providers._extras import require_extra

__all__ = ["THREAD_PREFIX", "AcpProvider", "AcpRun"]

THREAD_PREFIX = "subagent-acp"
"""Every ACP activation thread's name starts with this (``subagent-acp:<child_id>``)."""


class AcpProvider:
    """Runs each child activation as an ACP agent subprocess (``pip install '…[acp]'``).

    A start is ``initialize`` + ``session/new`` + ``session/prompt``; the agent's session
    id is written to the child's transcript (an ``acp/session`` event). A resume continues
    that session with ``session/resume`` when the agent advertises it (nothing replayed),
    else ``session/load`` when it advertises ``loadSession`` (its replay is not recorded
    again), otherwise opens a new session whose prompt opens with the child's transcript.
    When the agent advertises ``session/close``, the run closes its session before the
    process is ended. The agent's message chunks become ``assistant/message`` events (one
    per message), its tool calls ``tool/call`` and ``tool/result``. A run steers only when
    the agent advertises the ``_session/steering`` extension: then ``run.steer`` injects a
    follow-up into the running turn; otherwise ``steer`` is None and a follow-up during a
    turn is ``NOT_DELIVERED``.

    A running turn outlives its runtime (a crash, SIGKILL, a lost lease, or ``close()``
    handing it over) when its agent can reopen the session: the runtime that carries the
    Task on starts the agent again, reopens the session with ``session/resume``, else
    ``session/load`` (whose replay is not recorded again), and sends the open turn's
    messages again — its prompt and the steering messages it took — so the SAME Task
    completes in the SAME turn, each message in the transcript once. What the agent did
    before its process died stays recorded as far as it got (a message it was streaming
    is lost); whatever the agent persisted of the interrupted prompt is its own to
    reconcile (a runtime only cut off, not dead, keeps its agent until it finds its claim
    lost: for that while two agent processes hold the session, and only the new one's
    updates are recorded). An agent that offers neither method cannot go on: its Task ends
    ``interrupted``, saying so, and a message continues the child in a new turn
    (`recovery_refusal`, decided from the ``acp/session`` record before any agent is
    spawned); its runs are not handed over on ``close()``, which kills them, once this
    provider has seen such an agent answer ``initialize``.

    Args:
        command: The agent's command line (a list, or a string split like a shell would).
        name: The provider's key in the registry.
        cwd: The agent's working directory (and the session's ``cwd``); default: ours.
        env: Variables added to the agent's environment.
        permission: How permission requests are answered: ``deny`` (default), ``allow``,
            or ``ask``: each becomes an approval request to the child's parent,
            answered live — the agent waits inside its process, so the run never parks;
            if the runtime dies meanwhile the Task reads ``interrupted``.
        start_timeout_s: How long the agent may take to answer ``initialize`` and open the
            session.
        grace_s: How long a cancelled agent may take to end its prompt, how long it may
            take to answer ``session/close``, and how long it may take to exit after SIGTERM
            (sent 0.1 s after its stdin closed) before SIGKILL.
        steer_timeout_s: How long a steered message may wait for the agent to say it took
            it; past that it counts as not delivered (an agent that injects it later still
            has it: the reply may show it, the transcript does not).

    Raises:
        ImportError: the ``acp`` extra is not installed.
        SubagentControlError: ``INVALID_INPUT`` for an empty command or name.
    """

    def __init__(
        self,
        command: Sequence[str] | str,
        *,
        name: str = "acp",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        permission: PermissionPolicy = "deny",
        start_timeout_s: float = 30.0,
        grace_s: float = 2.0,
        steer_timeout_s: float = 10.0,
    ) -> None:
        require_extra("acp", extra="acp", needed_by="AcpProvider")
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv or not name:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, "AcpProvider needs a command and a non-empty name"
            )
        self._argv = argv
        self._name = name
        self._cwd = cwd
        self._env = dict(env) if env else None
        if permission not in ("deny", "allow", "ask"):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"permission must be 'deny', 'allow' or 'ask', not {permission!r}",
            )
        self._permission = permission
        self._start_timeout_s = start_timeout_s
        self._grace_s = grace_s
        self._steer_timeout_s = steer_timeout_s
        self._reopens: bool | None = None  # the last agent's answer: can it reopen a session?

    @property
    def recovers_turns(self) -> bool:
        """Whether a turn of this provider's children may be carried on after its runtime
        ended: True unless the last agent this provider started offered neither
        ``session/resume`` nor ``session/load`` (then ``close()`` kills its runs rather than
        hand them over). Whether one child's turn can is `recovery_refusal`'s answer."""
        return self._reopens is not False

    def recovery_refusal(self, events: Sequence[SessionEvent]) -> str | None:
        """Why the open turn of the child whose own events are ``events`` cannot be carried
        on by a new agent process, or None when it can (its session was recorded with
        ``session/resume`` or ``session/load`` to reopen it)."""
        return recovery_refusal(events, shlex.join(self._argv))

    def _saw(self, caps: Capabilities) -> None:
        self._reopens = caps.reopen is not None

    @property
    def name(self) -> str:
        """The provider's key in the provider registry."""
        return self._name

    @property
    def command(self) -> list[str]:
        """The agent's command line."""
        return list(self._argv)

    def start(self, request: StartRequest, signal: CancelSignal) -> AcpRun:
        """Spawn the agent, open a new session and send the prompt; return the run.

        Raises:
            SubagentControlError: ``CANCELLED`` when ``signal`` aborted first; ``TIMEOUT``
                or ``INTERNAL`` when the agent could not be started, with its words. Nothing
                is left running either way.
        """
        return self._launch(request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> AcpRun:
        """Like `start`, continuing the child's session (see the class docstring); with an
        ``open_turn``, the turn its dead runtime left open goes on."""
        return self._launch(request, signal)

    def _launch(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> AcpRun:
        run = AcpRun(self, request)
        run._begin(signal)
        return run

    def __repr__(self) -> str:
        return f"<AcpProvider {self._name!r} {shlex.join(self._argv)!r}>"


class AcpRun:
    """One activation of an ACP child: the agent process and its prompt.

    Attributes:
        child_id: The child this run belongs to.
        local_agent: None: an ACP child is not an agent of this process.
        steer: None unless the agent advertises the ``_session/steering`` extension; then
            ``steer(message, source)`` injects ``message`` into the running turn, and
            raises ``NOT_DELIVERED`` once the turn has settled or when the agent declines it.
            Set before the run is published.
    """

    def __init__(self, provider: AcpProvider, request: StartRequest | ResumeRequest) -> None:
        self.child_id = request.child_id
        self.local_agent: AgentHandle | None = None
        self.steer: Callable[[Sequence[TextBlock], MessageSource], None] | None = None
        self._provider = provider
        self._request = request
        self._recorder = AcpRecorder(
            request.transcript, provider._permission, desk=request.approvals
        )
        self._stderr = StderrTail(provider._argv[0])
        self._trace = request.trace  # current on the loop's thread: its requests nest under it
        self._signal = CancelSignal()  # aborted by the activation's signal or by dispose
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's, once it runs
        self._started = threading.Event()  # the prompt is on its way, or the start failed
        self._done = threading.Event()
        self._result: SubagentResult | None = None
        self._error: Exception | None = None
        self._prompting = False
        self._prompt: asyncio.Future[Any] | None = None  # the session/prompt request
        self._reaping = False  # past the conversation: nothing may cancel the task now
        self._canceller: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._session_id: str | None = None
        self._caps = Capabilities()
        self._steers = SteerWaiter(self.child_id)
        self._thread = threading.Thread(
            target=self._run_loop, name=f"{THREAD_PREFIX}:{self.child_id}", daemon=True
        )

    def result(self) -> SubagentResult:
        """Block until the agent's turn ends; ``output`` is its last non-empty message.

        Raises:
            SubagentControlError: the agent crashed, broke the protocol, or a write failed.
        """
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def dispose(self) -> None:
        """Cancel the turn if it still runs, reap the agent process, join the thread.

        Raises:
            SubagentControlError: ``TIMEOUT`` when the thread is still running after the
                cancel, SIGTERM and SIGKILL grace periods.
        """
        self._signal.abort("the run was disposed")
        self._thread.join(5 * self._provider._grace_s + 5.0)
        if self._thread.is_alive():
            raise SubagentControlError(
                ErrorCode.TIMEOUT,
                f"the ACP agent of child {self.child_id} could not be stopped",
                child_id=self.child_id,
            )

    def _begin(self, activation: CancelSignal) -> None:
        activation.add_callback(self._signal.abort)
        self._signal.add_callback(lambda _reason: self._started.set())
        self._thread.start()
        self._started.wait()
        failed_to_start = self._error is not None and not self._prompting
        if failed_to_start or self._signal.aborted:
            self.dispose()  # rolled back to quiescence before the start raises
            if self._error is not None and not activation.aborted:
                raise self._error
            reason = activation.reason or self._signal.reason
            raise start_cancelled(self.child_id, reason, "the agent was stopped")

    def _run_loop(self) -> None:
        try:
            # The runner cancels and awaits whatever tasks are left, then closes the loop.
            with self._trace.current(), asyncio.Runner() as runner:
                runner.run(self._main())
        finally:
            # The loop is gone: a steer still waiting is answered now, so the writer thread
            # has nothing left waiting for the transcript's lock.
            self._steers.end()
            self._recorder.close()
            self._started.set()
            self._done.set()

    async def _main(self) -> None:
        provider = self._provider
        task = asyncio.current_task()
        assert task is not None
        self._loop = asyncio.get_running_loop()
        self._signal.add_callback(lambda _reason: self._call_soon(self._on_abort, task))
        process = drain = guard = None
        try:
            guard = await GroupGuard.start(provider._grace_s)
            process = await spawn(provider._argv, provider._cwd, provider._env)
            guard.watch(process.pid)
            assert process.stderr is not None
            drain = asyncio.ensure_future(self._stderr.drain(process.stderr))
            await self._converse(process)
        except asyncio.CancelledError:
            self._finish(StopReason.ABORTED)
        except SubagentControlError as exc:
            self._error = exc
        except Exception as exc:
            self._error = await self._failure(exc, process)
        finally:
            self._reaping = True
            if process is not None:
                await reap(process, provider._grace_s)
                # Read the pipes to their end, so the process transport closes itself
                # before the loop does (else asyncio warns about an unclosed transport).
                with contextlib.suppress(Exception):
                    assert process.stdout is not None
                    await asyncio.wait_for(process.stdout.read(), provider._grace_s)
            if drain is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(drain, provider._grace_s)
            if guard is not None:
                await guard.release(provider._grace_s)

    async def _converse(self, process: asyncio.subprocess.Process) -> None:
        import acp

        assert process.stdin is not None
        assert process.stdout is not None
        # The recorder implements the two client methods an agent needs here; the others
        # (files, terminals) are answered "method not found", as its capabilities say.
        client: Any = self._recorder
        conn = acp.connect_to_agent(client, process.stdin, process.stdout)
        try:
            session_id, blocks = await asyncio.wait_for(
                self._open_session(conn), self._provider._start_timeout_s
            )
            self._conn, self._session_id = conn, session_id
            self._recorder.recording = True
            self._prompting = True
            if self._caps.steering:
                self.steer = self._steer  # before `start` returns: the run is not published yet
            # Its first step queues the request for the wire before any steer can run.
            self._prompt = asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=blocks))
            self._started.set()
            response = await self._prompt
            await self._recorder.write(self._recorder.end_turn, getattr(response, "usage", None))
            if self._recorder.failure is not None:
                raise self._recorder.failure
            reason = stop_reason_of(response.stop_reason)
            self._finish(StopReason.ABORTED if self._signal.aborted else reason)
        finally:
            abandoned = self._prompt is not None and self._prompt.cancelled()
            if self._caps.close and self._session_id is not None and not abandoned:
                await close_session(conn, self._session_id, self._provider._grace_s)
            with contextlib.suppress(Exception):
                await conn.close()

    async def _open_session(self, conn: Any) -> tuple[str, list[Any]]:
        import acp

        info = acp.schema.Implementation(name="subagent-control", version="0.1")
        init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_info=info)
        self._caps = Capabilities.of(init)
        self._provider._saw(self._caps)
        cwd = self._provider._cwd or os.getcwd()
        return await open_session(conn, self._caps, self._request, cwd)

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        """Inject ``message`` into the running turn through the agent's steering extension.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` once the turn has settled (answered,
                aborted, failed or disposed), when the agent declines the message, or when
                it does not say within ``steer_timeout_s`` that it took it.
        """
        if self._loop is None or self._signal.aborted:
            raise self._steers.refused(SETTLED)
        ask = self._steer_turn(text_of(message))
        self._steers.ask(self._loop, ask, self._provider._steer_timeout_s)

    async def _steer_turn(self, text: str) -> str | None:
        prompt = self._prompt
        if prompt is None or prompt.done() or self._signal.aborted or self._reaping:
            return SETTLED
        assert self._session_id is not None
        return await steer_session(self._conn, self._session_id, text)

    def _on_abort(self, task: asyncio.Task[None]) -> None:
        if self._reaping or task.done():
            return  # the turn is over: `reap` is ending the agent, and must not be cut short
        if self._prompt is None:
            task.cancel()  # still starting: stop where it is; `_main` reaps the process
            return
        self._canceller = task.get_loop().create_task(self._cancel_prompt(self._prompt))

    async def _cancel_prompt(self, prompt: asyncio.Future[Any]) -> None:
        # A well-behaved agent answers the prompt `cancelled`; one that does not within the
        # grace period has its prompt abandoned (never the run's task: that may be reaping
        # by then), and `_main` reaps the agent.
        grace_s = self._provider._grace_s
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.cancel(session_id=self._session_id), grace_s)
        await asyncio.wait({prompt}, timeout=grace_s)
        prompt.cancel()

    def _finish(self, stop_reason: str) -> None:
        output = self._recorder.output
        self._result = SubagentResult(
            stop_reason=stop_reason, output=[TextBlock(text=output)] if output else []
        )

    async def _failure(self, exc: Exception, process: Any) -> SubagentControlError:
        command = shlex.join(self._provider._argv)
        if isinstance(exc, TimeoutError):
            return SubagentControlError(
                ErrorCode.TIMEOUT,
                f"the ACP agent {command!r} did not answer initialize and open a session "
                f"within {self._provider._start_timeout_s}s; stderr: {self._stderr.text()}",
                child_id=self.child_id,
            )
        code = None
        if process is not None:  # a closed connection is most often an agent that exited
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(process.wait(), self._provider._grace_s)
        phase = "during its prompt" if self._prompting else "while starting"
        exited = f"exited with code {code}" if code is not None else "failed"
        return SubagentControlError(
            ErrorCode.INTERNAL,
            f"the ACP agent {command!r} {exited} {phase} ({type(exc).__name__}: {exc}); "
            f"stderr: {self._stderr.text()}",
            child_id=self.child_id,
        )

    def _call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing to stop
            loop.call_soon_threadsafe(fn, *args)

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "running"
        return f"<AcpRun {self.child_id!r} {state}>"
