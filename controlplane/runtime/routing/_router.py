"""Where a message goes: the one place that decides, for every send, kill and claim, whether
it is this runtime's to act on or another's.

A child's activation runs in at most one runtime at a time: the one holding the child's
claim in the store. A send to it goes, in this order:

==========================================  ==========================================
The child                                   The send
==========================================  ==========================================
a forward reached it in runtime X before    forwarded to X at once (no claim here that
(PostgreSQL)                                would only find it held); X's answer, or, if
                                            X no longer runs it, routed as below
its activation runs here, or it is idle     delivered here (`deliver_here`: steer the
and this runtime can claim it               running activation, or resume the idle child
                                            under a claim taken in the Task's admission)
idle, its claim held by a dead runtime      taken over: the claim is taken here (the dead
                                            runtime's Tasks settle ``interrupted``) and
                                            the child resumed here (``started``)
held by another live runtime, SQLite        ``OWNERSHIP_CONFLICT`` naming that runtime
held by another live runtime, PostgreSQL    forwarded to it through the database (its
                                            answer: ``steered`` with its Task id, or its
                                            refusal); not delivered because it let the
                                            child go or died: routed again
still moving after `_CLAIM_RACES` rounds    ``NOT_DELIVERED``: it went nowhere
==========================================  ==========================================

Never twice: a send is routed again only when it was delivered nowhere. A raise means not
delivered, except ``DURABILITY_FAILED`` (the run has it, the transcript may not; or, when
forwarded, the store could not confirm whether the holder took it).

Other runtimes' messages arrive here too (`serve_forwarded`): they only ever steer a running
activation, never resume the child here (their sender may resume it itself once this runtime
let it go). A kill (`TaskService.kill`) of a Task that runs in another runtime goes
`kill_elsewhere`: settled ``interrupted`` now if that runtime is dead; forwarded to it on
PostgreSQL; refused with ``OWNERSHIP_CONFLICT`` naming it on SQLite.

Built on the runtime and the forwarder, and handed to the Task service (which asks it to
claim a child and to kill a Task elsewhere); it reaches this runtime's own side — the actors
and the Task service, built after it — only through the two callables it is given,
`deliver_here` and `kill_here`, and serves other runtimes from `start` on, once that side
exists. The protocol of a forward is in `controlplane.runtime.routing._forwarding`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from controlplane.contract import (
    AgentHandle,
    ClaimConflict,
    ErrorCode,
    MessageSource,
    SendResult,
    SubagentControlError,
    TextBlock,
)

if TYPE_CHECKING:
    from actors import SendMessage
    from controlplane.contract import (
        AgentRegistry,
        ForwardedNode,
        NewEvent,
        TaskSnapshot,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from controlplane.runtime.routing._forward_serving import KillHere
    from controlplane.runtime.routing._forwarding import Forwarder
    from persistence import InboxItem

__all__ = ["DeliverHere", "Router"]

DeliverHere = Callable[[str, "SendMessage"], SendResult]
"""Hand a send to the child's supervisor in this runtime and return what it did (a steer is
returned once durable); raises the refusal as `SubagentControlError`, ``ClaimConflict`` when
another live runtime holds the child's claim."""

_CLAIM_RACES = 3
"""How many times a send is routed again after it was delivered nowhere (the holder let the
child go, or died, between the claim and the forward)."""


class Router:
    """Decides where each send, kill and claim of this runtime goes (the module's table).

    Args:
        runtime: This runtime: its id, its claims, whether another runtime is dead.
        forwarder: The forwarding through the database (PostgreSQL); None on SQLite, where a
            child held by another live runtime is refused with ``OWNERSHIP_CONFLICT``.
        agents: This runtime's agent registry (a forwarded message's parent session is
            given a handle there: it lives in the sender's runtime).
        deliver_here: Local delivery (`DeliverHere`).
        kill_here: Aborts a Task of this runtime whose kill was forwarded here; False if it
            is not running here.
    """

    def __init__(
        self,
        runtime: Runtime,
        forwarder: Forwarder | None,
        agents: AgentRegistry,
        *,
        deliver_here: DeliverHere,
        kill_here: KillHere,
    ) -> None:
        self._runtime = runtime
        self._forwarder = forwarder
        self._agents = agents
        self._deliver_here = deliver_here
        self._kill_here = kill_here
        self._closing = threading.Event()

    # -- sends from here -----------------------------------------------------------------

    def send(self, child_id: str, send: SendMessage) -> SendResult:
        """Route ``send`` to ``child_id`` wherever its activation runs (the module's table).

        Raises:
            SubagentControlError: not delivered (the refusal of whichever runtime was
                reached, ``OWNERSHIP_CONFLICT`` on SQLite for a child another live runtime
                holds, ``NOT_DELIVERED`` for one that kept moving), or ``DURABILITY_FAILED``.
        """
        sent = self._forward_known(child_id, send)
        if sent is not None:
            return sent
        for _race in range(_CLAIM_RACES):
            try:
                return self._deliver_here(child_id, send)
            except ClaimConflict as conflict:
                sent = self._forward_to_holder(child_id, send, conflict)
                if sent is not None:
                    return sent
        raise SubagentControlError(
            ErrorCode.NOT_DELIVERED,
            f"child {child_id} kept moving between runtimes; the message was not delivered; "
            "retry it",
            child_id=child_id,
        )

    def _forward_known(self, child_id: str, send: SendMessage) -> SendResult | None:
        """Forward straight to the runtime a forward last reached the child in; None when
        there is none, or it no longer runs the child (not delivered: route it here)."""
        if self._forwarder is None:
            return None
        return self._forwarder.forward_known(
            child_id,
            parent_session=send.parent.session_id,
            message=send.message,
            source=send.source,
        )

    def _forward_to_holder(
        self, child_id: str, send: SendMessage, conflict: ClaimConflict
    ) -> SendResult | None:
        """Forward to the live runtime that holds the child; None when it was delivered
        nowhere because that runtime let the child go or died: route it again."""
        if self._forwarder is None:
            raise conflict  # SQLite: no forwarding; the error names the runtime
        holder = self._forwarder.holder_of(child_id)
        if holder is None:
            return None  # the holder let the child go meanwhile
        return self._forwarder.forward(
            child_id,
            holder,
            parent_session=send.parent.session_id,
            message=send.message,
            source=send.source,
        )

    # -- sends from other runtimes -------------------------------------------------------

    def serve_forwarded(self, item: InboxItem) -> SendResult:
        """Deliver a message another runtime forwarded here: steer only, as the sender's
        parent session (not registered here: it lives in the sender's runtime).

        Raises:
            SubagentControlError: the refusal (answered to the sender); ``CLOSED`` once this
                runtime has begun to close.
        """
        if self._closing.is_set():
            raise SubagentControlError(
                ErrorCode.CLOSED, "the control plane is closed; open a new one to continue"
            )
        from actors import SendMessage

        parent = AgentHandle(self._agents, item.parent_session, model=None, depth=0)
        send = SendMessage(
            parent=parent,
            message=tuple(TextBlock.model_validate(block) for block in item.message),
            source=MessageSource.model_validate(item.source),
            forwarded=item.inbox_id,
        )
        return self._deliver_here(item.child_id, send)

    # -- claims and kills (asked by the Task service) ------------------------------------

    def claim(self, task: TaskSnapshot, opening: Sequence[NewEvent] = ()) -> int | None:
        """Admit a resume's Task with the claim on its child, taking over a dead runtime's
        claim; the fencing number.

        Raises:
            SubagentControlError: ``ClaimConflict`` (``OWNERSHIP_CONFLICT``) naming the live
                runtime that holds the child (`send` forwards to it); ``CHILD_NOT_FOUND``.
        """
        return self._runtime.claim(task, opening)

    def kill_elsewhere(self, task: TaskSnapshot, reason: str) -> None:
        """Kill a running Task that this runtime does not run: settled ``interrupted`` now
        if its runtime is dead; forwarded to it if it lives (PostgreSQL), returning once it
        aborted the Task.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` naming its live runtime on SQLite;
                ``NOT_DELIVERED`` if that runtime did not take the forwarded kill.
        """
        runtime = self._runtime.runtime_of(task)
        if runtime is None or self._runtime.is_dead(runtime):
            self._runtime.interrupt(task, runtime)
            return
        if self._forwarder is not None:
            self._forwarder.kill(task, reason)
            return
        raise SubagentControlError(
            ErrorCode.OWNERSHIP_CONFLICT,
            f"task {task.id} runs in runtime {runtime.runtime_id} (process {runtime.pid} on "
            f"{runtime.host}), not in this one; kill it there ({reason} was not applied)",
            task_id=task.id,
            child_id=task.child_id,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Serve other runtimes' messages from now on (PostgreSQL): sends go to
        `serve_forwarded`, kills to ``kill_here``."""
        if self._forwarder is not None:
            self._forwarder.listen(self.serve_forwarded, self._kill_here)

    def stop_serving(self) -> None:
        """Close has begun: take no more forwarded messages (those taken are answered)."""
        self._closing.set()
        if self._forwarder is not None:
            self._forwarder.stop_listening()

    def close(self) -> None:
        """Wait for the messages being served to be answered, and stop forwarding."""
        self._closing.set()
        if self._forwarder is not None:
            self._forwarder.close()

    def in_flight(self) -> list[ForwardedNode]:
        """The forwards in flight, both ways, oldest first (for the tree dump)."""
        return self._forwarder.in_flight() if self._forwarder is not None else []
