"""The actor-tree dump: what the runtime is doing right now."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.contract._text import escape_controls
from controlplane.contract._usage import Usage

__all__ = [
    "ActivationNode",
    "ActorTree",
    "ForwardedNode",
    "SupervisorNode",
    "SupervisorState",
    "escape_controls",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

SupervisorState = Literal["idle", "starting", "running", "settling", "busy"]


class ActivationNode(BaseModel):
    """One activation actor, named by its Task id."""

    model_config = _FROZEN

    task_id: str
    kind: Literal["initial", "resumed", "continued"]
    published: bool
    task_status: str
    cancel_reason: str | None = None
    age_s: float
    fence: int | None = None
    """The fencing number of this runtime's claim on the child."""
    usage: Usage = Field(default_factory=Usage.zero)
    """What the activation's turn has written so far."""
    queue_position: int | None = None
    """While its Task is ``queued``: its place under its concurrency key (1 = next)."""
    queued_s: float | None = None
    """How long its Task waited (or has waited so far) for a concurrency slot."""


class SupervisorNode(BaseModel):
    """One supervisor actor, named by its child id.

    ``state`` is ``busy`` when the supervisor did not answer within the dump's bound; the
    other fields are then the last values known without asking it.
    """

    model_config = _FROZEN

    child_id: str
    parent_session: str | None
    state: SupervisorState
    task_id: str | None = None
    task_status: str | None = None
    held_messages: int = 0
    mailbox_depth: int = 0
    last_activity: datetime
    activation: ActivationNode | None = None
    label: str | None = None
    """Its latest activation's label (the child's, or the follow-up that resumed it)."""


class ForwardedNode(BaseModel):
    """A message in flight between runtimes: on the sender, forwarded and
    waiting for its answer (``sending``); on the runtime that runs the child, taken and
    being delivered (``serving``)."""

    model_config = _FROZEN

    inbox_id: str
    direction: Literal["sending", "serving"]
    child_id: str
    runtime_id: str
    """The other end: where it was sent (``sending``), or where it came from (``serving``)."""
    age_s: float


class ActorTree(BaseModel):
    """The root actor and the supervisors under it."""

    model_config = _FROZEN

    taken_at: datetime
    closed: bool
    supervisors: list[SupervisorNode]
    runtime_id: str | None = None
    """The runtime (process) the tree belongs to: it holds the claims of its activations."""
    forwarded: list[ForwardedNode] = Field(default_factory=list)
    """Messages in flight to or from other runtimes, oldest first."""

    def render(self) -> str:
        """A readable, indented text tree, one line per actor.

        Times (``quiet=``, how long since the supervisor last handled a message, and the
        activation's age) are relative to ``taken_at``, so the text reads the same whenever
        it is printed. Control characters in ids and reasons are shown escaped.
        """
        count = len(self.supervisors)
        noun = "supervisor" if count == 1 else "supervisors"
        closed = ", closed" if self.closed else ""
        runtime = f" runtime {self.runtime_id}" if self.runtime_id else ""
        flying = f", {len(self.forwarded)} forwarded" if self.forwarded else ""
        lines = [
            escape_controls(
                f"root{runtime} ({count} {noun}{flying}{closed}) at "
                f"{self.taken_at.isoformat(timespec='seconds')}"
            )
        ]
        for i, sup in enumerate(self.supervisors):
            last = i == count - 1 and not self.forwarded
            quiet_s = max(0.0, (self.taken_at - sup.last_activity).total_seconds())
            task = ""
            if sup.task_id is not None and sup.activation is None:
                task = f" task={sup.task_id} ({sup.task_status or '?'})"
            lines.append(
                escape_controls(
                    f"{'└─' if last else '├─'} supervisor {sup.child_id} [{sup.state}]"
                    f" parent={sup.parent_session or '?'}{task} held={sup.held_messages}"
                    f" mailbox={sup.mailbox_depth} quiet={quiet_s:.1f}s"
                    + (f" label={sup.label!r}" if sup.label else "")
                )
            )
            act = sup.activation
            if act is not None:
                pad = "   " if last else "│  "
                cancel = f" cancel={act.cancel_reason!r}" if act.cancel_reason else ""
                cancel = (f" fence={act.fence}" if act.fence is not None else "") + cancel
                spent = act.usage
                if spent.stored():  # what its turn has written so far, when anything
                    cost = f" cost=${spent.cost:.4f}" if spent.cost is not None else ""
                    cancel = (
                        f" tokens={spent.total_tokens} calls={spent.model_calls}{cost}" + cancel
                    )
                lines.append(
                    escape_controls(
                        f"{pad}└─ activation {act.task_id} ({act.kind},"
                        f" {'published' if act.published else 'unpublished'},"
                        f" {act.task_status}, age {act.age_s:.1f}s){cancel}"
                    )
                )
        for i, fwd in enumerate(self.forwarded):
            way = "to" if fwd.direction == "sending" else "from"
            lines.append(
                escape_controls(
                    f"{'└─' if i == len(self.forwarded) - 1 else '├─'} forwarded {fwd.inbox_id}"
                    f" [{fwd.direction}] child={fwd.child_id} {way} runtime {fwd.runtime_id}"
                    f" age {fwd.age_s:.1f}s"
                )
            )
        return "\n".join(lines)
