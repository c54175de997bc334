"""The root actor: owns the supervisors' lifecycle (creation, shutdown, tree dump).

It fills the routing table (`actors.routing`), which callers read without a hand-off, so
a steer into a running turn costs no hop (its sender puts it into the activation's inbox,
`actors._inbox`) and any other send two: caller → supervisor → caller. A message for a child with no
supervisor in this process (the first after a restart) goes caller → root → supervisor →
caller: the root creates the supervisor and hands the message straight on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, cast

import pykka

from actors._answer import NO_ANSWER, answer_of
from actors._base import Actor
from actors._record import ActivationSlot
from actors.context import ActorContext
from actors.messages import (
    BeginActivation,
    Describe,
    DescribeAll,
    PassivateIfIdle,
    Reply,
    Routed,
    RouteSend,
    SendMessage,
    Shutdown,
    SpawnChild,
    StopAccepting,
    Sweep,
)
from actors.routing import Route, RoutingTable
from actors.supervisor import (
    ChildSupervisor,
    ChildSupervisorProxy,
    mailbox_depth,
    reply_of,
)
from controlplane.contract import ErrorCode, SubagentControlError, SupervisorNode

__all__ = ["IDLE_SUPERVISOR_CAP", "Passivator", "RootActor", "RootActorProxy"]

IDLE_SUPERVISOR_CAP = 1000
"""Supervisors a process keeps before idle ones retire early. Past it, each new supervisor
offers retirement (at most every `CAPPED_SWEEP_S`) to those idle for `CAPPED_IDLE_S`,
whatever ``passivate_after_s`` says. An idle supervisor holds no thread (its loop runs on a
pooled worker only while it has messages: `actors._parking`), but it is still ~10 KiB of
objects: under churn, with ``passivate_after_s`` at 300 s, thousands would pile up, while a
child whose supervisor retired only pays a cold resume's start at its next message."""
CAPPED_IDLE_S = 1.0
CAPPED_SWEEP_S = 0.5


class RootActor(Actor):
    """Creates supervisors on demand, dumps them, and stops them on shutdown."""

    def __init__(self, context: ActorContext, table: RoutingTable) -> None:
        super().__init__()
        self._ctx = context
        self._table = table
        self._accepting = True
        self._next_capped_sweep = 0.0

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, SpawnChild):
            return self._spawn(message)
        if isinstance(message, RouteSend):
            return self._route_send(message)
        if isinstance(message, DescribeAll):
            return self._describe_all(message.timeout_s)
        if isinstance(message, Sweep):
            return self._sweep(message.idle_for_s)
        if isinstance(message, StopAccepting):
            self._accepting = False
            return None
        if isinstance(message, Shutdown):
            return self._shutdown(message.timeout_s)
        raise TypeError(f"root actor got an unknown message {message!r}")

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise SubagentControlError(
                ErrorCode.CLOSED, "the control plane is closing; nothing was started"
            )

    def _spawn(self, spawn: SpawnChild) -> Route:
        self._check_accepting()
        plan = spawn.plan
        if self._table.get(plan.child_id) is not None:
            raise SubagentControlError(
                ErrorCode.OWNERSHIP_CONFLICT,
                f"child {plan.child_id} already has a supervisor",
                child_id=plan.child_id,
            )
        slot = ActivationSlot()
        ref = _start_supervisor(
            plan.child_id,
            "nothing was started",
            self._ctx,
            self._table,
            plan.child_id,
            parent_session=plan.parent.session_id,
            initial=plan,
            slot=slot,
        )
        route = Route(plan.child_id, ChildSupervisorProxy(ref, slot), plan.parent.session_id)
        self._table._put(route)
        self._cap_idle()
        # Only now: an activation that failed at once could retire its supervisor, and a
        # retirement must find the route it removes.
        ref.tell(BeginActivation())
        return route

    def _route_send(self, route_send: RouteSend) -> Routed:
        child_id = route_send.child_id
        route = self._table.get(child_id)
        if route is None:
            self._check_accepting()
            slot = ActivationSlot()
            ref = _start_supervisor(
                child_id,
                "the message was not delivered",
                self._ctx,
                self._table,
                child_id,
                slot=slot,
            )
            route = Route(child_id, ChildSupervisorProxy(ref, slot), None)
            self._table._put(route)
            self._cap_idle()
        # Not waited for here: the root never blocks on a supervisor; the caller reads it.
        ref = route.supervisor.ref
        return Routed(supervisor=ref, reply=ref.ask(route_send.send, block=False))

    def _describe_all(self, timeout_s: float) -> list[SupervisorNode]:
        routes = self._table.routes()
        # Ask every supervisor at once, then collect within one shared deadline: a busy
        # supervisor is shown as busy, never waited for.
        asks = [(r, r.supervisor.ref.ask(Describe(), block=False)) for r in routes]
        deadline = time.monotonic() + timeout_s
        nodes = []
        for route, future in asks:
            try:
                node = future.get(timeout=max(0.0, deadline - time.monotonic()))
            except (pykka.Timeout, pykka.ActorDeadError):
                node = SupervisorNode(
                    child_id=route.child_id,
                    parent_session=route.parent_session,
                    state="busy",
                    mailbox_depth=mailbox_depth(route.supervisor.ref),
                    last_activity=route.created_at,
                )
            nodes.append(node)
        return nodes

    def _cap_idle(self) -> None:
        """Past `IDLE_SUPERVISOR_CAP` supervisors, offer the idle ones early retirement."""
        if len(self._table) <= IDLE_SUPERVISOR_CAP:
            return
        now = time.monotonic()
        if now < self._next_capped_sweep:
            return
        self._next_capped_sweep = now + CAPPED_SWEEP_S
        self._sweep(CAPPED_IDLE_S)

    def _sweep(self, idle_for_s: float) -> None:
        offer = PassivateIfIdle(idle_for_s=idle_for_s)
        for route in self._table.routes():
            with contextlib.suppress(pykka.ActorDeadError):  # retired meanwhile
                route.supervisor.ref.tell(offer)

    def _shutdown(self, timeout_s: float) -> None:
        self._accepting = False
        routes = self._table.routes()
        futures = [r.supervisor.ref.stop(block=False) for r in routes]
        deadline = time.monotonic() + timeout_s
        for future in futures:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                continue
        self._table._clear()


def _start_supervisor(child_id: str, consequence: str, *args: Any, **kwargs: Any) -> Any:
    """Start a child's supervisor; a failure (no thread left, …) is a coded error the
    caller can act on, never a raw exception from inside the actor system."""
    try:
        return ChildSupervisor.start(*args, **kwargs)
    except Exception as exc:
        raise SubagentControlError(
            ErrorCode.INTERNAL,
            f"could not create the supervisor of child {child_id} ({exc}); {consequence}; "
            "retry later",
            child_id=child_id,
        ) from exc


class RootActorProxy:
    """Typed access to the root actor from outside its thread."""

    __slots__ = ("ref",)

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self.ref = ref

    def spawn_child(self, spawn: SpawnChild) -> Route:
        """Create a child's supervisor with its initial activation.

        Raises:
            pykka.ActorDeadError: the root stopped first; nothing was spawned.
        """
        return cast(Route, self._answer(spawn))

    def route_send(self, child_id: str, send: SendMessage) -> Reply | None:
        """Send through the root to a child this caller found no route for: the root
        creates its supervisor if needed and hands the message on; the supervisor answers
        (None: it retired before handling it).

        Raises:
            pykka.ActorDeadError: the root stopped first; the message went nowhere.
            SubagentControlError: the root or the supervisor refused the message.
        """
        routed = cast(Routed, self._answer(RouteSend(child_id=child_id, send=send)))
        return reply_of(routed.reply)

    def _answer(self, message: SpawnChild | RouteSend) -> Any:
        # No deadline: the root never waits on another actor, and giving up early would
        # leave the caller unable to say whether its child started or its message went.
        answer = answer_of(self.ref.ask(message, block=False))
        if answer is NO_ANSWER:
            raise pykka.ActorDeadError("the root actor stopped before it handled the message")
        return answer

    def describe_all(self, timeout_s: float) -> list[SupervisorNode]:
        """Every supervisor's node; busy ones are not waited for past ``timeout_s``."""
        nodes = self.ref.ask(DescribeAll(timeout_s=timeout_s), timeout=timeout_s + 5.0)
        return cast(list[SupervisorNode], nodes)

    def stop_accepting(self, timeout_s: float) -> None:
        """Refuse new supervisors from now on."""
        self.ref.ask(StopAccepting(), timeout=timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        """Stop every supervisor, then the root itself."""
        try:
            self.ref.ask(Shutdown(timeout_s=timeout_s), timeout=timeout_s + 5.0)
        finally:
            self.ref.stop(block=True, timeout=timeout_s)


class Passivator:
    """Retires idle supervisors: every sweep period (half of ``idle_for_s``, at most a
    minute), asks the root to offer each supervisor retirement if it has been idle for
    ``idle_for_s`` seconds (an idle supervisor holds no thread, but its objects and route
    stay until it retires; an idle child needs none of them until its next message). So a
    supervisor retires within one period after ``idle_for_s``.
    """

    _MAX_PERIOD_S = 60.0

    def __init__(self, root: pykka.ActorRef[Any], idle_for_s: float) -> None:
        self._root = root
        self._sweep = Sweep(idle_for_s=idle_for_s)
        self._period_s = min(idle_for_s / 2, self._MAX_PERIOD_S)
        self._stopped = threading.Event()
        # Daemon: a script that never calls close() must still exit (see `actors._base`).
        self._thread = threading.Thread(target=self._run, name="subagent-passivator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sweeping; returns once the thread has ended. Idempotent."""
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._period_s):
            try:
                self._root.tell(self._sweep)
            except pykka.ActorDeadError:
                return
