"""Local delivery: hand a send to the child's supervisor in this process and return what
it did — the one place that reads a supervisor's `Reply`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import pykka

from actors.messages import SendMessage
from actors.routing import RoutingTable
from controlplane.contract import ErrorCode, ParkedTask, SendResult, SubagentControlError

if TYPE_CHECKING:
    from actors.root import RootActorProxy

__all__ = ["deliver"]

_REDIRECTS: Final = 16


def deliver(
    table: RoutingTable,
    root: RootActorProxy,
    child_id: str,
    send: SendMessage,
    *,
    check_open: Callable[[], None],
) -> SendResult:
    """Deliver ``send`` to ``child_id`` through its supervisor here (made on demand by the
    root): ``steered`` once the message's record is durable, or ``started``.

    A supervisor that retired or stopped without handling the message (its ask answered
    `pykka.ActorDeadError`, never a guess) is passed by: the message goes to the child's
    next supervisor, after ``check_open`` (which raises once the control plane closed);
    so is one a parked run refused after its supervisor took the run's messages back
    (`ParkedTask`: never delivered; the park is known when it is sent again).

    Raises:
        SubagentControlError: the supervisor's refusal, as it raised it (`ParkedTask`
            when the last try was refused so); ``CLOSED`` once the root is gone;
            ``INTERNAL`` for a failure inside the actor system.
    """
    parked: ParkedTask | None = None  # the last attempt's refusal, when it was one
    for _ in range(_REDIRECTS):
        parked = None
        route = table.get(child_id)
        try:
            if route is not None:
                reply = route.supervisor.send(send)
            else:
                reply = root.route_send(child_id, send)
            if reply is not None:
                return reply.result()
        except ParkedTask as exc:
            # Refused by the parked run after its supervisor took its messages back (a
            # drainer held it then): never delivered, and the park is known now, so sent
            # again it goes into the parked Task's continued turn.
            check_open()
            parked = exc
            continue
        except SubagentControlError:
            raise
        except Exception as exc:
            raise _translated(exc) from exc
        check_open()
    if parked is not None:
        raise parked  # the refusal that ended the tries names its cause: the parked Task
    raise SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id}: its supervisor kept retiring; the message was not delivered",
        child_id=child_id,
    )


def _translated(exc: Exception) -> SubagentControlError:
    """A failure inside the actor system as the caller's coded error: the root gone is
    ``CLOSED``; anything unexpected is ``INTERNAL``. (KeyboardInterrupt and SystemExit are
    not caught: they are the caller's own.)"""
    consequence = "the message was not delivered"
    if isinstance(exc, (pykka.ActorDeadError, pykka.Timeout)):
        return SubagentControlError(
            ErrorCode.CLOSED, f"the control plane is closing; {consequence}"
        )
    return SubagentControlError(ErrorCode.INTERNAL, f"internal error ({exc}); {consequence}")
