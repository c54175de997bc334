"""Budgets at run time: the gate each activation's run asks before a call, the
refusal of a resume past a limit, `set_budget`, and the soft notices.

Every decision reads the store's spend ledger (`persistence.SqlStore.spend`), never a
count kept in this process: siblings running in several runtimes share one ancestor's or
one session's budget, and each sees what the others' appends have committed. A gate
checks the rows of its child's scopes (the child, each ancestor child, the session)
before each model call and tool call, and refuses the call when a limit it spends is
reached (spent >= limit): a model call is held against tokens, cost, model calls and
seconds, a tool call against tool calls and seconds.

Each check sees rows at least as new as the end of the run's previous call. The turn's
first check reads them, or uses what the resume's refusal check read moments before
(under five seconds: a Task that waited in a queue reads again). After that, each append
that records a call's spend returns its scopes' rows as that commit left them (every
runtime's committed spend included), and the next check uses those with no read of its
own. A check with nothing newer than what the previous call was checked against (a call
that failed before its append, calls whose usage is held with an unpublished turn) reads
again. So a run never starts a call on rows older than the end of its own previous call:
a call that starts within the limits may finish past them, and another runtime's spend
committed after the rows were taken shows at the run's next call at the latest, so the
spend passes a limit by at most one call per activation running then.

Seconds are wall-clock time: each turn's, from its activation's start to its end on this
host's monotonic clock, is added to its scopes with its ``turn/end``; a gate adds the
running turn's time so far.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

from controlplane.contract import (
    LIMITS,
    MODEL_CALL,
    TOOL_CALL,
    TOOL_ROUND,
    Budget,
    ErrorCode,
    Prices,
    Spent,
    SubagentControlError,
    budget_of,
    count_problem,
    fold_descriptor,
)
from controlplane.runtime._defaults import DEFAULT_MAX_TOOL_ROUNDS, DEFAULT_NOTICE_AT

if TYPE_CHECKING:
    from controlplane.contract import (
        ActivationFacts,
        Descriptor,
        FencedCall,
        TaskNotice,
    )
    from persistence import ScopeCounts, ScopeSpend, SpendLedger, SqlStore

__all__ = [
    "DEFAULT_MAX_TOOL_ROUNDS",
    "DEFAULT_NOTICE_AT",
    "Budgets",
    "check_budget_options",
    "stored_descriptor",
]

_MODEL_LIMITS: Final = ("tokens", "cost", "model_calls", "seconds")
_TOOL_LIMITS: Final = ("tool_calls", "seconds")
_AT: Final = {
    name: at for at, name in enumerate(("tokens", "cost", "model_calls", "tool_calls", "seconds"))
}
"""Where each limit's spend is in a `ScopeCounts` (and in a gate's running spend)."""
_BUDGET: Final = 5
_WARNED: Final = 6
_CHILD: Final = "child:"
_SESSION: Final = "session:"
_VALIDATED: Final = 1024  # distinct stored budgets kept validated (cleared when full)
_ADMITTED_S: Final = 5.0
"""How old a resume's read of the counters may be to serve its turn's first check."""
_R = TypeVar("_R")


def check_budget_options(
    *,
    session_budget: object,
    tree_budget: object,
    budget_notice_at: object,
    max_tool_rounds: object,
) -> tuple[Budget | None, Budget | None]:
    """The budget options of `SubagentControl`, checked before anything is built.

    Returns:
        ``session_budget`` and ``tree_budget`` as `Budget` values (a mapping is taken).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` naming the first option that is off.
    """
    session = budget_of(session_budget, what="session_budget")
    tree = budget_of(tree_budget, what="tree_budget")
    if budget_notice_at is not None and (
        isinstance(budget_notice_at, bool)
        or not isinstance(budget_notice_at, int | float)
        or not 0 < budget_notice_at <= 1
    ):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"budget_notice_at must be a fraction in (0, 1] or None, not {budget_notice_at!r}",
        )
    if max_tool_rounds is not None:
        problem = count_problem(max_tool_rounds)
        if problem is not None:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"max_tool_rounds {problem}, or None"
            )
    return session, tree


def stored_descriptor(store: SqlStore, child_id: str) -> Descriptor | None:
    """The newest descriptor of a stored child (what its next turn will run as)."""
    return fold_descriptor(store.load(child_id).own_events)


class Budgets:
    """The control plane's budgets: its options, over the store's spend ledger."""

    def __init__(
        self,
        spend: SpendLedger,
        *,
        session_budget: Budget | None,
        tree_budget: Budget | None,
        notice_at: float | None,
        max_tool_rounds: int | None,
        prices: Prices | None = None,
        descriptor_of: Callable[[str], Descriptor | None] | None = None,
    ) -> None:
        self._spend = spend
        self._prices = prices if prices is not None else Prices()
        self._descriptor_of = descriptor_of
        self._session = session_budget
        self.tree_budget = tree_budget
        """The budget of a top-level child started without one."""
        self._notice_at = notice_at
        self._max_rounds = max_tool_rounds
        self._lock = threading.Lock()
        self._validated: dict[tuple[tuple[str, type, Any], ...], Budget | None] = {}
        self._by_identity: dict[int, tuple[dict[str, float], Budget | None]] = {}
        self._admitted: dict[str, tuple[float, tuple[str, ...], dict[str, ScopeSpend]]] = {}
        self._limits: dict[int, tuple[Budget, tuple[tuple[str, float, float | None], ...]]] = {}

    # -- the actors' side (`BudgetPort`) ------------------------------------------------

    def gate(
        self,
        view: ActivationFacts,
        *,
        label: str,
        own: Budget | None,
        held: Callable[[], Spent],
        fenced: FencedCall | None = None,
    ) -> _Gate:
        """The gate of one activation (see the module docstring)."""
        gate = _Gate(self, view, label, own, held, fenced)
        admitted = self._admitted_rows(view.child_id)
        if admitted is not None:
            gate.admitted(*admitted)
        return gate

    def check_resume(self, child_id: str) -> None:
        """Refuse to resume a child with a limit of its scopes reached (any limit: its
        next turn could not run).

        Raises:
            SubagentControlError: ``BUDGET_EXHAUSTED``; nothing was delivered.
        """
        read_at = time.monotonic()
        scopes, rows = self._spend.chain_spend(child_id)  # one read, on a cold plane too
        for scope in scopes:
            row = rows.get(scope)
            budget = self.budget_of_scope(scope, row.budget if row else None)
            if budget is None:
                continue
            reached = (row.spent if row else Spent()).reached(budget, LIMITS)
            if reached is not None:
                raise SubagentControlError(
                    ErrorCode.BUDGET_EXHAUSTED,
                    f"child {child_id} cannot continue: {_whose(scope, child_id, reached)}; "
                    "the message was not delivered and no task was started; its parent can "
                    "raise the budget with set_budget",
                    child_id=child_id,
                )
        if len(scopes) > 1:  # stored (its chain ends with its session): the turn's rows
            with self._lock:
                if len(self._admitted) >= _VALIDATED:
                    self._admitted.clear()
                self._admitted[child_id] = (read_at, scopes, rows)

    def _admitted_rows(self, child_id: str) -> tuple[tuple[str, ...], dict[str, ScopeSpend]] | None:
        """What the resume's refusal check of ``child_id`` just read, taken once by the
        gate of the turn it admitted (None when older than `_ADMITTED_S`: a Task that
        waited in a queue, or a check whose resume never started)."""
        with self._lock:
            found = self._admitted.pop(child_id, None)
        if found is None or time.monotonic() - found[0] > _ADMITTED_S:
            return None
        return found[1], found[2]

    # -- the facade's side ----------------------------------------------------------------

    def set_budget(self, session: str, child_id: str, budget: object) -> None:
        """Replace the budget of ``session``'s child ``child_id`` (see the facade).

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for a bad budget; ``CHILD_NOT_FOUND``
                for a child that is not the session's (nothing changed either way).
        """
        checked = budget_of(budget)
        if self._spend.parent_of(child_id) != session:
            raise _unknown(child_id)
        if checked is not None and checked.cost is not None and self._descriptor_of is not None:
            self.require_priced(checked, self._descriptor_of(child_id))
        limits = checked.limits() if checked is not None else None
        self._spend.set_budget(child_id, limits or None)

    def require_priced(self, budget: Budget | None, descriptor: Descriptor | None) -> None:
        """Refuse a cost limit for a child whose model has no price: its calls' cost would
        stay unknown, so the limit could never hold.

        Raises:
            SubagentControlError: ``INVALID_INPUT``; nothing was stored.
        """
        if budget is None or budget.cost is None or self._prices.is_priced(descriptor):
            return
        model = descriptor.agent_model if descriptor is not None else None
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"a cost budget needs a price for the child's model ({model or 'no model named'}), "
            "and none is known: open the control plane with prices={...} for it, or give the "
            "budget no cost limit",
        )

    def drain(self, owner: str) -> list[tuple[datetime, TaskNotice]]:
        """Take ``owner``'s soft budget notices."""
        return self._spend.drain(owner)

    # -- shared ------------------------------------------------------------------------

    def budget_of_scope(self, scope: str, stored: dict[str, float] | None) -> Budget | None:
        """A scope's budget: a session's is this runtime's option; a child's is the one
        its row keeps (its descriptor's, or what `set_budget` put there)."""
        if scope.startswith(_SESSION):
            return self._session
        if not stored:
            return None
        # The store hands out one dict per distinct stored budget: found by identity
        # first (the entry keeps the dict alive, so its id stays its own).
        known = self._by_identity.get(id(stored))
        if known is not None and known[0] is stored:
            return known[1]
        # Every gate check reads every budgeted scope: validating the same stored limits
        # each time was a fifth of a check's cost. A `Budget` is immutable, so one per
        # distinct stored form serves them all (the key keeps each limit's type: 1 and
        # True, or 100 and 100.0, are not the same stored budget).
        key = tuple([(name, type(limit), limit) for name, limit in stored.items()])
        try:
            found = self._validated[key]
        except (KeyError, TypeError):
            pass
        else:
            self._remember(stored, found)
            return found
        try:
            budget: Budget | None = Budget.model_validate(stored)
        except (SubagentControlError, ValueError):
            budget = None  # not a budget this code wrote: no limit, rather than a guess
        try:
            with self._lock:
                if len(self._validated) >= _VALIDATED:
                    self._validated.clear()
                self._validated[key] = budget
        except TypeError:
            pass  # a limit that is not hashable is no budget either: nothing to keep
        self._remember(stored, budget)
        return budget

    def limits_of(self, budget: Budget) -> tuple[tuple[str, float, float | None], ...]:
        """``budget``'s limits that are set, each with the spend its soft notice comes at
        (None without notices), in `LIMITS` order: what a check compares, worked out
        once per budget (a `Budget` is immutable; the entry keeps it, so its id stays
        its own)."""
        known = self._limits.get(id(budget))
        if known is not None and known[0] is budget:
            return known[1]
        notice_at = self._notice_at
        plan = tuple(
            (name, limit, None if notice_at is None else notice_at * limit)
            for name, limit in budget.limits().items()
        )
        with self._lock:
            if len(self._limits) >= _VALIDATED:
                self._limits.clear()
            self._limits[id(budget)] = (budget, plan)
        return plan

    def _remember(self, stored: dict[str, float], budget: Budget | None) -> None:
        with self._lock:
            if len(self._by_identity) >= _VALIDATED:
                self._by_identity.clear()
            self._by_identity[id(stored)] = (stored, budget)


class _Gate:
    """One activation's `TurnGate`: asked from the run's thread, read by its activation.

    Whose spend it checks (the child, its parent session, the Task a notice names) it
    reads from the activation's frozen view; what it keeps is its own: the rows its next
    check uses, the turn's tool rounds and the reason it stopped the run."""

    def __init__(
        self,
        budgets: Budgets,
        view: ActivationFacts,
        label: str,
        own: Budget | None,
        held: Callable[[], Spent],
        fenced: FencedCall | None = None,
    ) -> None:
        self._budgets = budgets
        self._held = held
        # Each store call of the gate runs inside it (the activation's fence); a check
        # answered from the rows its run's appends left makes none, and pays nothing.
        self._fenced: FencedCall = _unfenced if fenced is None else fenced
        self._spend = budgets._spend
        self._view = view
        self._label = label
        self._own = own
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._scopes: tuple[str, ...] | None = None
        # The rows the next call is checked against: a read no call has been checked
        # against yet, else a view the store published after number `_seen` (the newest
        # one this gate used, or the newest before it existed: an earlier turn's).
        self._unused: dict[str, ScopeCounts] | None = None
        self._seen = self._spend.newest(view.child_id)
        self._rounds = 0
        self._exhausted: str | None = None
        self._limited = False  # the last check found a budget on some scope

    def admitted(self, scopes: tuple[str, ...], rows: dict[str, ScopeSpend]) -> None:
        """The rows the resume that admitted this turn read (`Budgets.check_resume`),
        for its first check: no call of this run came between."""
        self._scopes, self._unused = scopes, _counts(rows)

    @property
    def exhausted(self) -> str | None:
        return self._exhausted

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def check(self, call: str) -> None:
        if self._exhausted is not None:
            raise self._error()
        if call == TOOL_ROUND:
            self._rounds += 1
            cap = self._budgets._max_rounds
            if cap is not None and self._rounds > cap:
                self._trip(
                    f"tool round cap of {cap} per turn reached (the model asked for round "
                    f"{self._rounds}); send a message to continue in a new turn"
                )
            return
        if call not in (MODEL_CALL, TOOL_CALL):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a gate checks {MODEL_CALL!r}, {TOOL_ROUND!r} or {TOOL_CALL!r}, not {call!r}",
            )
        self._evaluate(_MODEL_LIMITS if call == MODEL_CALL else _TOOL_LIMITS)
        # A call starts on these rows: the next one needs rows its append (or a read)
        # leaves after it.
        self._unused = None

    def ended(self) -> None:
        if self._limited and self._budgets._notice_at is not None:
            self._evaluate(())

    # -- plumbing -------------------------------------------------------------------------

    def _evaluate(self, names: tuple[str, ...]) -> None:
        # Held first: if publication writes them between the two reads, they count twice
        # (a stop one call early), never not at all.
        held = self._held()
        scopes, rows = self._rows()
        # The run's own, not stored yet: what it holds, and its time so far. Each limit
        # compares a scope's stored spend plus this, one number at a time (a check runs
        # before every call: no `Spent` is built unless a limit or a notice needs words).
        running = (
            held.tokens, held.cost, held.model_calls, held.tool_calls,
            held.seconds + self.elapsed_s(),
        )  # fmt: skip
        budgets = self._budgets
        notice_at = budgets._notice_at
        limited = False
        for index, scope in enumerate(scopes):
            row = rows.get(scope)
            if row is None:
                # Index 0: the child's own, not stored yet: its descriptor's holds.
                budget = self._own if index == 0 else budgets.budget_of_scope(scope, None)
            else:
                budget = budgets.budget_of_scope(scope, row[_BUDGET])
            if budget is None:
                continue
            limited = True
            noticed = row is not None and bool(row[_WARNED])
            for name, limit, notice in budgets.limits_of(budget):
                at = _AT[name]
                value = running[at] if row is None else row[at] + running[at]
                if value >= limit and name in names:
                    self._limited = True
                    spent = _spent(row, running)
                    reached = spent.reached(budget, names) or f"{name} budget reached"
                    self._trip(_whose(scope, self._view.child_id, reached))
                if notice is not None and value >= notice and not noticed and notice_at:
                    noticed = True  # one notice per scope and check: the first limit's
                    passed = _spent(row, running).passed(budget, notice_at)
                    if passed is not None:
                        self._warn(scopes, index, passed)
        self._limited = limited

    def _rows(self) -> tuple[tuple[str, ...], dict[str, ScopeCounts]]:
        """The scopes and the rows to check against (see the module docstring)."""
        scopes = self._scopes
        if scopes is None:  # the turn's first check: its chain and rows, one statement
            view = self._view
            scopes, found = self._fenced(
                lambda: self._spend.chain_and_rows(view.child_id, view.owner_session)
            )
            self._scopes, self._unused = scopes, _counts(found)
            return scopes, self._unused
        published = self._spend.view(self._view.child_id, self._seen)
        if published is not None:
            viewed = published[1]
            for scope in scopes:
                if scope not in viewed:
                    break
            else:
                self._seen, self._unused = published
                return scopes, viewed
        if self._unused is None:
            self._unused = _counts(self._fenced(lambda: self._spend.read(scopes)))
        return scopes, self._unused

    def _warn(self, scopes: tuple[str, ...], index: int, passed: str) -> None:
        scope = scopes[index]
        if scope.startswith(_SESSION):
            owner = scope[len(_SESSION) :]
            child = _child_of(scopes[index - 1]) if index > 0 else self._view.child_id
            subject = f"session {owner} (its subagents together)"
        else:
            child = _child_of(scope)
            above = scopes[index + 1] if index + 1 < len(scopes) else None
            owner = _child_of(above) if above is not None else self._view.owner_session
            subject = f"subagent {child}" + ("" if index == 0 else " (with its subagents)")
        summary = f"budget notice: {subject} has spent {passed}"
        notice = (owner, self._view.task_id, child, self._label, summary)
        self._fenced(lambda: self._spend.warn(scope, notice))

    def _trip(self, why: str) -> None:
        with self._lock:
            if self._exhausted is None:
                self._exhausted = why
        raise self._error()

    def _error(self) -> SubagentControlError:
        return SubagentControlError(
            ErrorCode.BUDGET_EXHAUSTED, self._exhausted or "budget exhausted",
            child_id=self._view.child_id, task_id=self._view.task_id,
        )  # fmt: skip


def _unfenced(call: Callable[[], _R]) -> _R:
    return call()


def _counts(rows: dict[str, ScopeSpend]) -> dict[str, ScopeCounts]:
    """Rows read whole (`ScopeSpend`) as a gate checks them (`ScopeCounts`)."""
    out: dict[str, ScopeCounts] = {}
    for scope, row in rows.items():
        s = row.spent
        out[scope] = (
            s.tokens,
            s.cost,
            s.model_calls,
            s.tool_calls,
            s.seconds,
            row.budget,
            row.warned,
        )
    return out


def _spent(row: ScopeCounts | None, running: tuple[int, float, int, int, float]) -> Spent:
    """A scope's stored spend plus the run's own, as `Spent` (for a refusal's or a
    notice's words)."""
    if row is None:
        return Spent(*running)
    return Spent(*(row[at] + running[at] for at in range(5)))  # type: ignore[arg-type]


def _child_of(scope: str) -> str:
    return scope.split(":", 1)[1]


def _whose(scope: str, child_id: str, reached: str) -> str:
    if scope == f"{_CHILD}{child_id}":
        return reached
    if scope.startswith(_SESSION):
        return f"{reached} (the budget of session {_child_of(scope)}, shared by its subagents)"
    return f"{reached} (the budget of subagent {_child_of(scope)}, which it runs under)"


def _unknown(child_id: object) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.CHILD_NOT_FOUND,
        f"no child {child_id!r} for this session; list your children and use one of those ids",
        child_id=child_id if isinstance(child_id, str) else None,
    )
