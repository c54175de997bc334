"""`SubagentControl`'s approvals: the option that configures them and the call
that answers a child's request.

Kept apart from the facade, as `controlplane.runtime.spend._spend_api` is: `ApprovalApi` is the
mixin `SubagentControl` inherits `answer` from, and the hand-off by which an answer (or a sweep)
continues a parked Task in this runtime, through the child's supervisor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.contract import ErrorCode, SubagentControlError

# `SubagentControl` inherits `ApprovalApi`: the actor system and the contract's models are
# imported in the calls that use them, so that importing the facade builds no model.
if TYPE_CHECKING:
    from actors import SendMessage
    from controlplane.contract import (
        AgentRegistry,
        MessageSource,
        Requester,
        SendResult,
    )
    from controlplane.runtime.approvals._approvals import Approvals

__all__ = ["DEFAULT_APPROVAL_GRACE_S", "ApprovalApi", "check_grace"]

DEFAULT_APPROVAL_GRACE_S = 2.0
"""How long a child's run waits for an approval answer holding its thread, by default."""


def check_grace(value: object) -> float:
    """``approval_grace_s`` checked: a finite number of seconds, 0 or more.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` otherwise.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != value
        or value < 0
        or value == float("inf")
    ):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"approval_grace_s must be a finite number of seconds >= 0, not {value!r}",
        )
    return float(value)


class ApprovalApi:
    """The approvals surface of `SubagentControl` (a mixin: the facade builds ``_approvals``)."""

    _approvals: Approvals | None
    agents: AgentRegistry

    def answer(
        self,
        requester: Requester,
        request_id: str,
        *,
        allow: bool,
        note: str | None = None,
        source: MessageSource | None = None,
    ) -> None:
        """Answer a child's approval request (`TaskSnapshot.request`), once.

        Allowed, the tool runs once and the child goes on; denied, its model reads that the
        call was denied, with ``note``. The Task that asked goes on and settles, whichever
        runtime answers and whatever restarts came between.

        Args:
            requester: The child's direct parent (its `AgentHandle` or session id).
            request_id: The request's id (``tasks.get(...).request.id``, or its notice).
            allow: Whether the tool may run.
            note: Why, for the child's model.
            source: Who answers; ``MessageSource(kind="human")`` for a person, who may
                answer from any session. Defaults to the requester as coordinator.

        Raises:
            SubagentControlError: ``INVALID_INPUT``; ``REQUEST_NOT_FOUND`` (unknown, or a
                request of another session's child); ``REQUEST_CLOSED`` (answered
                already, or its Task settled); ``PERSISTENCE_UNAVAILABLE`` without a
                store; ``CLOSED``. Nothing is changed then.
        """
        self._require_approvals().answer(requester, request_id, allow=allow, note=note,
                                         source=source)  # fmt: skip

    def _require_approvals(self) -> Approvals:
        self._check_open()
        if self._approvals is None:
            raise SubagentControlError(
                ErrorCode.PERSISTENCE_UNAVAILABLE,
                "approvals are kept in the store, and no store is configured; build the "
                "control plane with one (SubagentControl.open(url))",
            )
        return self._approvals

    def _continue_parked(self, child_id: str, task_id: str, parent_session: str) -> None:
        """Continue a parked Task here
        (`controlplane.runtime.approvals._approvals.ContinueHere`)."""
        from actors import SendMessage
        from controlplane.contract import AgentHandle, MessageSource

        parent = AgentHandle(self.agents, parent_session, model=None, depth=0)
        source = MessageSource(kind="system", sender_session_id="approval")
        send = SendMessage(parent=parent, message=(), source=source, continues=task_id)
        self._route(child_id, send)

    if TYPE_CHECKING:  # the facade's own

        def _check_open(self) -> None: ...

        def _route(self, child_id: str, send: SendMessage) -> SendResult: ...
