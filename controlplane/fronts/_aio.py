"""An asyncio front for the control plane.

`SubagentControl` blocks: pykka futures, store writes and waits on settlement all park the
calling thread, and awaited from a coroutine they would freeze the event loop. Here every
blocking call runs in a worker thread, and `AsyncSubagentControl.wait` holds no thread at
all while a Task runs: it is woken by the Task service's completion listener.

Cancelling an awaiting coroutine abandons the answer, never the operation halfway: a call
once submitted to a worker thread runs to its end (a start starts, a message is delivered or
refused as a whole), and a cancelled `wait` only stops listening. The control plane is left
exactly as the synchronous call would leave it.

Example:
    aio = AsyncSubagentControl(control)
    start = await aio.start_continuable(spec)
    snapshot = await aio.wait(start.task_id, timeout=60, requester=parent)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from controlplane.contract import (
    AgentHandle,
    Budget,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    MessageSource,
    SendResult,
    SubagentControlError,
    TaskSnapshot,
    TextBlock,
    Usage,
)
from controlplane.runtime._validate import check_timeout

if TYPE_CHECKING:
    from controlplane.contract import ChildView
    from controlplane.runtime._facade import SubagentControl
    from controlplane.runtime.tasks._tasks import TaskNotice

__all__ = ["AsyncSubagentControl"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

Requester = AgentHandle | str

_RELEASE_GRACE_S: Final = 5.0
_LOOK_AGAIN_S: Final = 0.5
"""How often a wait looks at a Task nothing here will wake it for (another runtime's)."""
"""How long `wait` allows, after a Task settled, for its activation to be removed. That
follows settlement at once; the bound only keeps a broken control plane from hanging us."""


class AsyncSubagentControl:
    """Awaitable versions of the `SubagentControl` calls that block.

    Args:
        control: The control plane.
        executor: Where blocking calls run; None uses the event loop's default executor
            (`asyncio.to_thread`). Pass your own to bound or to join that work.
    """

    def __init__(self, control: SubagentControl, *, executor: Executor | None = None) -> None:
        self._control = control
        self._executor = executor

    @property
    def control(self) -> SubagentControl:
        """The synchronous control plane behind this front."""
        return self._control

    async def run_blocking(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a blocking call in a worker thread and await its result.

        Once submitted, the call runs to its end even if the awaiting coroutine is
        cancelled: cancelling a queued `concurrent.futures` job would drop it, so whether
        an abandoned send happened would depend on thread scheduling. An abandoned call's
        failure is logged, never silently dropped.
        """
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # as asyncio.to_thread does
        call = functools.partial(context.run, fn, *args, **kwargs)
        future = loop.run_in_executor(self._executor, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(functools.partial(_log_abandoned, fn))
            raise

    async def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableStart:
        """`SubagentControl.start_continuable`, awaited."""
        return await self.run_blocking(self._control.start_continuable, spec)

    async def send_message(
        self,
        parent: AgentHandle,
        child_id: str,
        message: str | Sequence[TextBlock],
        source: MessageSource | None = None,
    ) -> SendResult:
        """`SubagentControl.send_message`, awaited (a message is a ``str`` or a list of
        `TextBlock`).

        A steer held until its run is published keeps its worker thread until then;
        cancelling this coroutine does not withdraw the message.
        """
        return await self.run_blocking(
            self._control.send_message, parent, child_id, message, source
        )

    async def wait(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Wait until the Task has settled and its activation is gone, or it waits for an
        approval answer (``input_required``), like `tasks.wait`.

        No thread is held while the Task runs. Once this returns, a follow-up message
        starts the child's next activation.

        Raises:
            SubagentControlError: ``TASK_NOT_FOUND``; ``TIMEOUT`` if it has not settled
                within ``timeout`` seconds (the Task keeps running); ``INVALID_INPUT`` for
                a negative or non-finite timeout.
        """
        check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if not await self._settled(task_id, deadline, requester):
            raise SubagentControlError(
                ErrorCode.TIMEOUT,
                f"task {task_id} is still running after {timeout}s; wait again",
                task_id=task_id,
            )
        return await self._released(task_id, deadline, requester)

    async def wait_or_snapshot(
        self, task_id: str, timeout: float | None = None, *, requester: Requester
    ) -> TaskSnapshot:
        """Like `wait`, but a Task still running at the deadline is returned as it is."""
        check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if not await self._settled(task_id, deadline, requester):
            return await self.get(task_id, requester=requester)
        return await self._released(task_id, deadline, requester)

    async def get(self, task_id: str, *, requester: Requester) -> TaskSnapshot:
        """`tasks.get`, awaited."""
        return await self.run_blocking(self._control.tasks.get, task_id, requester=requester)

    async def kill(self, task_id: str, *, requester: Requester) -> None:
        """`tasks.kill`, awaited (returns once the kill is requested)."""
        await self.run_blocking(self._control.tasks.kill, task_id, requester=requester)

    async def output(self, task_id: str, *, requester: Requester) -> str:
        """`tasks.output`, awaited."""
        return await self.run_blocking(self._control.tasks.output, task_id, requester=requester)

    async def list_tasks(self, requester: Requester) -> list[TaskSnapshot]:
        """`tasks.list`, awaited."""
        return await self.run_blocking(self._control.tasks.list, requester)

    async def children(self, parent: AgentHandle) -> list[ChildView]:
        """`SubagentControl.children`, awaited (it may read the store)."""
        return await self.run_blocking(self._control.children, parent)

    async def drain_notices(self, requester: Requester) -> list[TaskNotice]:
        """`tasks.drain_notices`, awaited."""
        return await self.run_blocking(self._control.tasks.drain_notices, requester)

    async def usage(self, requester: Requester, child_id: str, *, tree: bool = False) -> Usage:
        """`SubagentControl.usage`, awaited (it reads the store)."""
        return await self.run_blocking(self._control.usage, requester, child_id, tree=tree)

    async def session_usage(self, requester: Requester) -> Usage:
        """`SubagentControl.session_usage`, awaited (it reads the store)."""
        return await self.run_blocking(self._control.session_usage, requester)

    async def set_budget(self, requester: Requester, child_id: str, budget: Budget | None) -> None:
        """`SubagentControl.set_budget`, awaited (it writes the store)."""
        await self.run_blocking(self._control.set_budget, requester, child_id, budget)

    async def answer(
        self,
        requester: Requester,
        request_id: str,
        *,
        allow: bool,
        note: str | None = None,
        source: MessageSource | None = None,
    ) -> None:
        """`SubagentControl.answer`, awaited (it writes the store)."""
        await self.run_blocking(
            self._control.answer, requester, request_id, allow=allow, note=note, source=source
        )

    async def close(self, *, timeout_s: float | None = None) -> None:
        """`SubagentControl.close`, awaited: cancels every activation and waits for it."""
        await self.run_blocking(self._control.close, timeout_s=timeout_s)

    # -- waiting without a thread --------------------------------------------------------

    async def _settled(self, task_id: str, deadline: float | None, requester: Requester) -> bool:
        """Wait until the Task is terminal; False at the deadline. Fenced by ``get``."""
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[None] = loop.create_future()

        def on_done(snapshot: TaskSnapshot) -> None:
            # Runs on the settling activation's thread: hand over, never block.
            if snapshot.id == task_id:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(_resolve, settled)

        # Subscribe before the first look, so a Task settling in between is not missed.
        unsubscribe = self._control.tasks.on_done(on_done)
        unrest = self._control._tasks.on_rest(on_done)  # the runtime's service: not a user verb
        try:
            while True:
                snapshot = await self.get(task_id, requester=requester)
                if snapshot.status.is_resting:
                    return True
                # Woken when it settles or asks here; a Task of another runtime (or one
                # that asks there) is looked at again every `_LOOK_AGAIN_S`.
                step = loop.time() + _LOOK_AGAIN_S
                until = step if deadline is None else min(step, deadline)
                try:
                    async with asyncio.timeout_at(until):
                        await asyncio.shield(settled)
                except TimeoutError:
                    if deadline is not None and loop.time() >= deadline:
                        return False
                    continue
                return True
        finally:
            unrest()
            # Also on cancellation: a cancelled wait leaves no listener behind.
            unsubscribe()

    async def _released(
        self, task_id: str, deadline: float | None, requester: Requester
    ) -> TaskSnapshot:
        # Settled (or waiting for an answer), so the blocking wait is short.
        timeout = None
        if deadline is not None:
            timeout = max(deadline - asyncio.get_running_loop().time(), _RELEASE_GRACE_S)
        return await self.run_blocking(
            self._control.tasks.wait, task_id, timeout, requester=requester
        )


def _log_abandoned(fn: Callable[..., object], future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        # Nobody awaits this any more; the operator still learns it failed.
        log.warning("abandoned call %s failed: %s", getattr(fn, "__qualname__", fn), exc)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
