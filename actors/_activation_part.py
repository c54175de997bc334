"""What every part of `actors.activation.ActivationActor` reads of the actor: its context,
its plan, and how it tells its supervisor. Declared once here for the parts it inherits
(`actors._claim_step`, `actors._turn_preparing`, `actors._turn_endings`); the actor sets
them in its ``__init__``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.context import ActorContext
    from actors.messages import ActivationEnded, ActivationPlan, ClaimCommitted, Published, Settling

__all__ = ["ActivationPart"]


class ActivationPart:
    """The state the parts of an activation actor share (set by the actor)."""

    _ctx: ActorContext
    _plan: ActivationPlan

    if TYPE_CHECKING:

        def _tell(
            self, message: ClaimCommitted | Published | Settling | ActivationEnded
        ) -> None: ...
