"""Approvals: a child asks before a tool runs, and its parent or a person answers.

A provider's run asks through the activation's `ApprovalDesk` (``request.approvals``): the
request is written before anything runs, the Task reads ``input_required``, the parent gets
one notice. The answer comes through `SubagentControl.answer`, from any runtime. A run that
waits longer than a short grace period parks (`StopReason.INPUT_REQUIRED`): it ends holding
no thread, and the answer continues the same Task in the same turn (`ResumeRequest.open_turn`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from controlplane.contract._content import MessageSource
from controlplane.contract._json import JsonValue

__all__ = [
    "ApprovalAnswer",
    "ApprovalDesk",
    "ApprovalPolicy",
    "ApprovalRequest",
    "ApprovalState",
    "ApprovalTranscript",
]

ApprovalPolicy = Literal["never", "always"] | Callable[[dict[str, Any]], bool]
"""When a tool call needs approval: ``never``, ``always``, or a callable on its arguments."""

ApprovalState = Literal["open", "answered", "closed"]
"""A request's state: waiting for its answer; answered, the answer not yet taken by the
run; closed (the run took the answer, or the Task settled first)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ApprovalRequest(BaseModel):
    """A tool call waiting for approval: `TaskSnapshot.request` while its Task reads
    ``input_required``.

    Attributes:
        id: The request's id: what `SubagentControl.answer` takes.
        tool: The tool the child wants to call.
        arguments: The arguments it would call it with (as the model wrote them).
        reason: What the child said with the call, if anything.
        child_id: The child that asks.
        task_id: The Task that waits (and goes on once answered).
        created_at: When it asked.
        deadline_at: When it is denied unanswered, if the tool has a deadline.
    """

    model_config = _FROZEN

    id: str
    tool: str
    arguments: dict[str, JsonValue]
    reason: str | None = None
    child_id: str | None = None
    task_id: str | None = None
    created_at: datetime | None = None
    deadline_at: datetime | None = None


class ApprovalAnswer(BaseModel):
    """The answer to an `ApprovalRequest`, as the run takes it.

    Attributes:
        request_id: The request it answers.
        allow: Whether the tool may run.
        note: Why, for the child's model to read.
        source: Who answered (the parent, a human, or ``system`` for a deadline).
    """

    model_config = _FROZEN

    request_id: str
    allow: bool
    note: str | None = None
    source: MessageSource


class ApprovalTranscript(Protocol):
    """What a desk writes through: the activation's transcript
    (`actors._transcript.ActivationTranscript`)."""

    @property
    def turn(self) -> int:
        """The turn it writes (the one a request asked from belongs to)."""
        ...

    def append_with(
        self,
        kind: str,
        data: dict[str, Any],
        source: MessageSource | None,
        also: Callable[[Any], None],
    ) -> None:
        """Append one event now, with more statements in its transaction."""
        ...

    def park_with(self, park: Callable[[], bool]) -> bool:
        """Run ``park`` (the claim given up) once every steered message is recorded, with
        no steer let in meanwhile; if it returns True the turn takes nothing more."""
        ...


@runtime_checkable
class ApprovalDesk(Protocol):
    """Where one activation's run asks for approvals (``request.approvals``)."""

    def ask(
        self,
        *,
        tool: str,
        arguments: Mapping[str, JsonValue],
        call_id: str,
        reason: str | None = None,
        deadline_s: float | None = None,
        pending: Sequence[Mapping[str, JsonValue]] = (),
        parkable: bool = True,
    ) -> str:
        """Write the request — its ``approval/request`` event, its row, the Task
        ``input_required`` — in one transaction, and return its id. ``pending``: the
        calls of the same reply still to run after this one (a continued turn runs them);
        ``parkable``: whether the run can end while it waits (an ACP agent cannot).

        Raises:
            SubagentControlError: ``FENCED``, ``DURABILITY_FAILED``: nothing was asked.
        """
        ...

    def wait(self, request_id: str, *, park: bool = True) -> ApprovalAnswer | None:
        """Block until the request is answered (or its deadline denies it) and take the
        answer: its ``approval/answer`` event is written and the Task reads ``running``
        again. With ``park``, past the control plane's grace period (``approval_grace_s``)
        unanswered, park instead — the child's claim is given up, the Task stays
        ``input_required`` — and return None: the run must then end at once with
        `StopReason.INPUT_REQUIRED`. Without, wait for the answer however long it takes
        (a run that cannot end while it waits: an ACP agent's). A message steered into
        the run before it parks is recorded first; one sent after is refused
        ``NOT_DELIVERED`` (its sender's retry continues the parked Task with it).

        Raises:
            SubagentControlError: ``CANCELLED`` when the activation is killed while it
                waits; ``FENCED`` when it lost its claim.
        """
        ...
