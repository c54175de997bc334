"""A send awaited on an event loop that parks no worker thread on the supervisor's answer.

`SubagentControl.send_message` blocks its caller twice: on the child's supervisor (a pykka
ask) and, for a steer, on the message's durable record (`Reply.result`: the sender's thread
drains the activation's inbox and commits, or waits for whoever does). From a coroutine the
whole call used to run in a worker thread: the loop wakes a worker, the worker wakes the
supervisor and sleeps until it answers, commits, and wakes the loop — four thread switches
where the API's caller makes two.

`send_async` asks the supervisor from the loop with an answer future of its own
(`_Answer`): the supervisor's thread, setting it, hands what is left to where it can run.
The steer's commit (a store write: it never runs on the loop) is submitted from there to a
worker, which resolves the loop's future when the record is durable; an answer with nothing
left to wait for resolves it at once. Three switches for a steer (loop → supervisor → worker
→ loop), two for anything answered outright, and no thread waits on an actor.

Every promise of the synchronous call holds, because the rest of the send is the same code:

- The checks are `SubagentControl`'s own (`_send_of`), run on the loop (they do no I/O).
- Exactly once or not delivered: the supervisor's answers that mean "delivered nowhere"
  (it retired or stopped first; the child's claim is another runtime's; its run is parking
  on an approval request) send the message again through the router in a worker, as
  `Router.send` itself does after them; a refusal is raised as the supervisor raised it.
- ``steered`` only once durable: the result is `Reply.result`'s, in a worker.
- Cancelling the awaiting coroutine abandons the answer only: once the message is in the
  supervisor's mailbox, its answer, the commit and any second routing are driven by the
  threads that produce them, not by the coroutine, so the send ends as it would have; what
  the store holds says whether it was delivered, and a failure nobody awaits is logged.

The rest goes through the worker as a whole (`Router.send`): a child without a supervisor
here (a resume that may claim it, take it over or forward the message), and a send the
telemetry records (its span spans the synchronous call).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import pykka
from pykka._envelope import Envelope  # pykka's ask, minus its future: see `_ask`

from actors.messages import Reply
from controlplane.contract import (
    AgentHandle,
    ClaimConflict,
    ErrorCode,
    MessageSource,
    ParkedTask,
    SendResult,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
)

if TYPE_CHECKING:
    from pykka._types import OptExcInfo

    from actors import SendMessage
    from controlplane.runtime._facade import SubagentControl
    from controlplane.runtime._handle import Message

__all__ = ["running_here", "send_async"]

log = logging.getLogger(__name__)

_POOL_LOCK: Final = threading.Lock()
_pool: ThreadPoolExecutor | None = None

_ROUTE_AGAIN: Final = (pykka.ActorDeadError, ParkedTask, ClaimConflict)
"""A supervisor's answers that mean the message was delivered nowhere (`actors._delivery`
and `Router.send` send it again after each)."""


def _default_pool() -> ThreadPoolExecutor:
    """Where the commits of sends without an executor of their own run (a supervisor's
    thread submits to it, so it cannot be the loop's default executor)."""
    global _pool
    with _POOL_LOCK:
        if _pool is None:
            _pool = ThreadPoolExecutor(thread_name_prefix="subagent-send")
        return _pool


async def send_async(
    control: SubagentControl,
    parent: AgentHandle,
    child_id: str,
    message: Message,
    source: MessageSource | None = None,
    *,
    executor: Executor | None = None,
) -> SendResult:
    """`SubagentControl.send_message`, awaited without a worker thread waiting on the
    child's supervisor (the module's docstring).

    Args:
        executor: Where the blocking rest runs (a steer's commit, a send routed as a whole);
            None uses a pool of this module's.

    Raises:
        SubagentControlError: as `SubagentControlError.send_message`.
    """
    loop = asyncio.get_running_loop()
    pool = executor if executor is not None else _default_pool()
    if not control._telemetry.quiet():  # a span around the whole synchronous call
        return await _in_worker(loop, pool, control.send_message, parent, child_id, message, source)
    router, send = control._send_of(parent, child_id, message, source, None)
    route = control._routes.get(child_id)
    if route is None:  # no supervisor here: claimed, taken over or forwarded by the router
        return await _in_worker(loop, pool, router.send, child_id, send)
    outcome: asyncio.Future[SendResult] = loop.create_future()
    answer = _Answer(loop, outcome, pool, functools.partial(router.send, child_id, send))
    _ask(route.supervisor.ref, send, answer)
    try:
        return await outcome
    except asyncio.CancelledError:
        answer.abandoned(child_id)
        raise


def running_here(
    control: SubagentControl, task_id: str, requester: AgentHandle
) -> TaskSnapshot | None:
    """The requester's Task ``task_id`` while it runs in this runtime, read in memory as
    `tasks.get` reads it (no store read, so a loop may call it); None otherwise (read it
    with `tasks.get` in a worker)."""
    live = control._tasks._live.get(task_id)
    if live is None:
        return None
    snapshot = live.snapshot()  # its spend so far is the activation's in-memory count
    if snapshot.status is not TaskStatus.RUNNING or snapshot.owner_session != requester.session_id:
        return None
    return snapshot


async def _in_worker(
    loop: asyncio.AbstractEventLoop, pool: Executor, fn: Callable[..., SendResult], *args: Any
) -> SendResult:
    """``fn(*args)`` in ``pool``; once submitted it runs to its end even if the awaiting
    coroutine is cancelled (its failure then logged)."""
    future = loop.run_in_executor(pool, functools.partial(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_log_abandoned)
        raise


def _ask(ref: pykka.ActorRef[Any], message: SendMessage, answer: _Answer) -> None:
    """`pykka.ActorRef.ask` with ``answer`` as its future (pykka makes its own, which no
    one can be told about when it is set)."""
    try:
        if not ref.is_alive():
            raise pykka.ActorDeadError(f"{ref} not found")
    except pykka.ActorDeadError:
        answer.set_exception()
    else:
        ref.actor_inbox.put(Envelope(message, reply_to=answer))


class _Answer(pykka.Future[Any]):
    """The supervisor's answer to one `SendMessage`, continued on the thread that sets it.

    ``set`` and ``set_exception`` run on the supervisor's thread (or the one refusing the
    ask: `actors._base._Inbox`), once; they never block it: the loop is called back, or
    the blocking rest is submitted to ``pool``, which calls the loop back. ``get`` (the
    `pykka.Future` contract) waits for the answer itself.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        outcome: asyncio.Future[SendResult],
        pool: Executor,
        route_again: Callable[[], SendResult],
    ) -> None:
        super().__init__()
        self._loop = loop
        self._outcome = outcome
        self._pool = pool
        self._route_again = route_again
        self._lock = threading.Lock()
        self._answered = threading.Lock()  # held until answered (lighter than an Event)
        self._answered.acquire()
        self._value: Any = None
        self._exc: BaseException | None = None
        self._in = False
        self._abandoned: str | None = None

    # -- pykka's side -------------------------------------------------------------------

    def get(self, *, timeout: float | None = None) -> Any:
        answered = self._answered
        if not answered.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise pykka.Timeout(f"{timeout} seconds")
        answered.release()  # open for good: every later `get` passes at once
        if self._exc is not None:
            raise self._exc
        return self._value

    def set(self, value: Any | None = None) -> None:
        self._claim()
        self._value = value
        self._answered.release()
        try:
            if not isinstance(value, Reply):  # never handled (a retiring supervisor's None)
                self._submit(self._route_again)
            elif value.inbox is None and value.receipt is None:
                self._settle(value.result(), None)  # nothing left to wait for
            else:
                self._submit(value.result)  # the steer's commit, or the wait for it
        except Exception as exc:  # never into the actor's loop (see `_continue_failed`)
            self._continue_failed(exc)

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        self._claim()
        exc = (exc_info if exc_info is not None else sys.exc_info())[1]
        assert exc is not None
        self._exc = exc
        self._answered.release()
        try:
            if isinstance(exc, _ROUTE_AGAIN):
                self._submit(self._route_again)  # delivered nowhere: routed again, as a whole
            elif isinstance(exc, SubagentControlError):
                self._settle(None, exc)
            else:  # as `actors._delivery` says a failure inside the actor system
                self._settle(None, _translated(exc))
        except Exception as failure:
            self._continue_failed(failure)

    def _continue_failed(self, exc: Exception) -> None:
        """Handing the rest on failed (a bug, or an executor that refused the job): the
        sender learns it as ``INTERNAL``. Raised from ``set``, it would reach pykka's loop,
        whose ``set_exception`` on this answered future would stop the supervisor."""
        log.exception("a send's answer could not be handed on")
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
            self._loop.call_soon_threadsafe(
                self._resolve, None, SubagentControlError(ErrorCode.INTERNAL, f"{exc}; {_UNSURE}")
            )

    def set_get_hook(self, func: Any) -> None:
        raise NotImplementedError("a send's answer is continued where it is set, never hooked")

    def _claim(self) -> None:
        with self._lock:
            if self._in:
                raise queue.Full  # answered once already (pykka's contract)
            self._in = True

    # -- the rest of the send -------------------------------------------------------------

    def _submit(self, rest: Callable[[], SendResult]) -> None:
        try:
            self._pool.submit(self._finish, rest)
        except RuntimeError as exc:  # the pool shut down (the interpreter is exiting)
            self._settle(None, SubagentControlError(ErrorCode.CLOSED, f"{exc}; {_NOT_SENT}"))

    def _finish(self, rest: Callable[[], SendResult]) -> None:
        try:
            result = rest()
        except BaseException as exc:  # the caller's to see, as the synchronous call raises it
            self._settle(None, exc)
        else:
            self._settle(result, None)

    def _settle(self, result: SendResult | None, exc: BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._resolve, result, exc)
        except RuntimeError:  # the loop is closed: nobody awaits this any more
            if exc is not None:
                log.warning("a send nobody awaits failed: %s", exc)

    def _resolve(self, result: SendResult | None, exc: BaseException | None) -> None:
        outcome = self._outcome
        if outcome.done():  # the awaiting coroutine was cancelled
            if exc is not None:
                log.warning("abandoned send to child %s failed: %s", self._abandoned, exc)
            return
        if exc is not None:
            outcome.set_exception(exc)
        else:
            assert result is not None
            outcome.set_result(result)

    def abandoned(self, child_id: str) -> None:
        """The awaiting coroutine was cancelled: a failure still to come is logged."""
        self._abandoned = child_id


_NOT_SENT: Final = "the message was not delivered"
_UNSURE: Final = "whether the message was delivered is in the child's transcript"


def _translated(exc: BaseException) -> SubagentControlError:
    """A failure inside the actor system as `actors._delivery` codes it."""
    if isinstance(exc, pykka.Timeout):
        return SubagentControlError(ErrorCode.CLOSED, f"the control plane is closing; {_NOT_SENT}")
    return SubagentControlError(ErrorCode.INTERNAL, f"internal error ({exc}); {_NOT_SENT}")


def _log_abandoned(future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("abandoned send failed: %s", exc)
