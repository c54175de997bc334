"""What every actor of one control plane shares: the store and the thread-safe services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controlplane.contract import (
    AdmissionGate,
    AgentRegistry,
    ApprovalPort,
    BudgetPort,
    Prices,
    ProviderRegistry,
    TaskService,
    Telemetry,
)

if TYPE_CHECKING:
    from persistence import SqlStore

__all__ = ["ActorContext"]


@dataclass(frozen=True, slots=True)
class ActorContext:
    """The shared, thread-safe collaborators of the root, supervisor and activation actors."""

    store: SqlStore
    tasks: TaskService
    agents: AgentRegistry
    providers: ProviderRegistry
    telemetry: Telemetry
    """The control plane's spans, metrics and lifecycle logs."""
    runtime_id: str = ""
    """This runtime's id: the claims it takes on children name it."""
    prices: Prices = field(default_factory=Prices)
    """What the children's models cost (`SubagentControl.open(prices=...)`)."""
    budgets: BudgetPort | None = None
    """The budgets: each activation's gate, and the refusal of a resume past
    a limit. None: nothing is limited."""
    admission: AdmissionGate | None = None
    """The concurrency limits every activation passes before it runs (None: no limits)."""
    approvals: ApprovalPort | None = None
    """Approval requests: each activation's desk, and the claim of a parked
    Task this runtime continues. None: no store keeps requests."""
    hands_over: bool = False
    """Closing hands running turns over: a run stopped by
    `close` leaves its Task ``running`` in the store, its turn open, for a live runtime
    with its provider to recover; False: it is settled ``killed``."""
