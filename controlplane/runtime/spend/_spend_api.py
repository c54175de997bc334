"""`SubagentControl`'s spend and limits: its options, what they build, and the
calls that read or change what children spend.

Kept apart from the facade so that `controlplane.runtime._facade` reads as the wiring and the
core calls (start, send, Tasks, the tree). `SpendOptions` checks ``prices``, the budget
options and ``concurrency`` before anything is built, and builds the `Budgets` and the
`Admission` they configure; `SpendApi` is the mixin `SubagentControl` inherits
``prices``, ``usage``, ``session_usage`` and ``set_budget`` from, so they stay methods of
the one public class, with their signatures and docstrings.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from controlplane.contract import ErrorCode, SubagentControlError
from controlplane.runtime._validate import check_concurrency

# `SubagentControl` inherits `SpendApi` and checks its options with `SpendOptions`: the
# contract's models and the rest of the spend wing are imported in the calls that use
# them, so that importing the facade builds no model.
if TYPE_CHECKING:
    from controlplane.contract import (
        AgentRegistry,
        Budget,
        Descriptor,
        Price,
        Prices,
        Requester,
        Usage,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from controlplane.runtime.spend._admission import Admission
    from controlplane.runtime.spend._budgets import Budgets
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import SqlStore

__all__ = ["SpendApi", "SpendOptions"]


def _prices(prices: Prices | Mapping[str, Price | Mapping[str, Any]] | None) -> Prices:
    from controlplane.contract import Prices

    return prices if isinstance(prices, Prices) else Prices(prices)


@dataclass(frozen=True, slots=True)
class SpendOptions:
    """The spend and limits options of one control plane, checked."""

    prices: Prices
    session_budget: Budget | None
    tree_budget: Budget | None
    notice_at: float | None
    max_tool_rounds: int | None
    limits: Mapping[str, int]
    """``concurrency`` as checked: key → the most activations running at once."""

    @classmethod
    def checked(
        cls,
        *,
        prices: Prices | Mapping[str, Price | Mapping[str, Any]] | None,
        session_budget: Budget | None,
        tree_budget: Budget | None,
        budget_notice_at: float | None,
        max_tool_rounds: int | None,
        concurrency: Mapping[str, int] | None,
    ) -> SpendOptions:
        """The constructor's options, or ``INVALID_INPUT`` naming the first that is off
        (prices, then the budget options, then ``concurrency``)."""
        from controlplane.runtime.spend._budgets import check_budget_options

        checked_prices = _prices(prices)
        session, tree = check_budget_options(
            session_budget=session_budget,
            tree_budget=tree_budget,
            budget_notice_at=budget_notice_at,
            max_tool_rounds=max_tool_rounds,
        )
        limits = check_concurrency(concurrency) if concurrency is not None else {}
        return cls(checked_prices, session, tree, budget_notice_at, max_tool_rounds, limits)

    @staticmethod
    def precheck(options: MutableMapping[str, Any]) -> None:
        """`SubagentControl.open`'s check of the constructor's ``options``, before the
        store is made: a bad one leaves nothing to undo. ``prices`` is replaced by its
        checked `Prices`, so the constructor does not check it again."""
        from controlplane.runtime.spend._budgets import check_budget_options

        if options.get("concurrency") is not None:
            check_concurrency(options["concurrency"])
        if "prices" in options:
            options["prices"] = _prices(options["prices"])
        check_budget_options(
            session_budget=options.get("session_budget"),
            tree_budget=options.get("tree_budget"),
            budget_notice_at=options.get("budget_notice_at"),
            max_tool_rounds=options.get("max_tool_rounds"),
        )

    def budgets(self, store: SqlStore) -> Budgets:
        """The budgets over ``store``'s spend ledger."""
        from controlplane.runtime.spend._budgets import Budgets, stored_descriptor

        return Budgets(
            store.spend,
            session_budget=self.session_budget,
            tree_budget=self.tree_budget,
            notice_at=self.notice_at,
            max_tool_rounds=self.max_tool_rounds,
            prices=self.prices,
            descriptor_of=partial(stored_descriptor, store),
        )

    def admission(
        self, store: SqlStore, runtime: Runtime, tasks: TaskService, agents: AgentRegistry
    ) -> Admission | None:
        """This runtime's side of the concurrency limits; None without any."""
        from controlplane.runtime.spend._admission import Admission

        return Admission(self.limits, store, runtime, tasks, agents) if self.limits else None


class SpendApi:
    """What `SubagentControl` spends and may spend: its prices, the usage read back from
    the store, and `set_budget`. A mixin of the facade, which sets these fields and
    defines `_open_store`."""

    _prices: Prices
    _budgets: Budgets | None

    if TYPE_CHECKING:

        def _open_store(self) -> SqlStore:
            """The store, or ``CLOSED`` / ``PERSISTENCE_UNAVAILABLE`` (the facade's)."""

    @property
    def prices(self) -> Prices:
        """The prices this control plane was opened with; ``prices.is_priced(descriptor)``
        says whether a child's model has one (a cost can be known for it)."""
        return self._prices

    def usage(self, requester: Requester, child_id: str, *, tree: bool = False) -> Usage:
        """What ``child_id`` has spent over all its turns, read from the store.

        The sum of the usage recorded with its own events (a fork's seed is its parent's
        spend), so it holds across resumes, runtimes and restarts; a turn still running
        counts what it has written so far.

        Args:
            requester: The child's parent session (its live handle or its session id).
            child_id: The child.
            tree: Add what every descendant spent: the children ``child_id`` started,
                theirs, and so on.

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND`` for an unknown child or one that is
                not the requester's (the same error: whether it exists is not told);
                ``INVALID_INPUT`` for a requester that is neither a handle nor a session
                id; ``PERSISTENCE_UNAVAILABLE``, ``STORE_UNAVAILABLE``, ``CLOSED``.
        """
        from controlplane.runtime.spend._usage_views import child_usage

        return child_usage(self._open_store(), requester, child_id, tree=tree)

    def session_usage(self, requester: Requester) -> Usage:
        """Everything ``requester``'s children and all their descendants have spent, read
        from the store (across resumes, runtimes and restarts).

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for a requester that is neither a
                handle nor a session id; ``PERSISTENCE_UNAVAILABLE``,
                ``STORE_UNAVAILABLE``, ``CLOSED``.
        """
        from controlplane.runtime.spend._usage_views import session_usage

        return session_usage(self._open_store(), requester)

    def set_budget(self, requester: Requester, child_id: str, budget: Budget | None) -> None:
        """Replace ``child_id``'s budget: durable, across runtimes and restarts,
        over the one its start set; what it has spent so far counts. ``None`` removes it.

        A child its budget stopped can be continued once this gives it room (a send to it
        is refused ``BUDGET_EXHAUSTED`` until then); its soft notice may come again.

        Args:
            requester: The child's parent session (its live handle or its session id).
            child_id: The child.
            budget: A `Budget` (or a mapping of its limits), or None.

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for a bad budget or requester;
                ``CHILD_NOT_FOUND`` for an unknown child or one that is not the
                requester's (the same error); ``PERSISTENCE_UNAVAILABLE``,
                ``STORE_UNAVAILABLE``, ``CLOSED``. Nothing changes when it raises.
        """
        from controlplane.contract import budget_of, requester_session

        self._open_store()
        assert self._budgets is not None  # built with the store
        session = requester_session(requester)
        if not isinstance(child_id, str) or not child_id or "\x00" in child_id:
            budget_of(budget)  # a bad budget is named first, whatever the id
            raise SubagentControlError(
                ErrorCode.CHILD_NOT_FOUND,
                f"no child {child_id!r} for this session; list your children and use one of "
                "those ids",
            )
        self._budgets.set_budget(session, child_id, budget)

    def _start_budget(self, parent: object) -> Budget | None:
        """The budget a child of ``parent`` starts with when its spec sets none: the tree
        budget for a top-level child."""
        from controlplane.contract import AgentHandle

        if self._budgets is not None and isinstance(parent, AgentHandle) and parent.depth == 0:
            return self._budgets.tree_budget
        return None

    def _require_priced(self, descriptor: Descriptor) -> None:
        """``INVALID_INPUT`` for a cost budget on a child whose model has no price."""
        if self._budgets is not None:
            self._budgets.require_priced(descriptor.budget, descriptor)
