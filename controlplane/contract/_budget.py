"""Budgets: what a child, with everything it starts, may spend, and the gate a
run asks before each model call and tool call.

A `Budget` is a set of limits. The spend it is held against is counted in the store, in
the same transaction as the event that records it (`persistence`'s spend ledger), once
for every scope the spending child belongs to: the child itself, each ancestor child (a
child started by a child), and the top-level parent session. So what a grandchild spends
counts against its parent's, its grandparent's and the session's budgets.

A run asks its `SpendGate` before it starts a call; a call that starts within every limit
may finish past one (a model call's tokens are known only when it returns), so the spend
passes a limit by at most one call per activation running at that moment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, model_validator

from controlplane.contract._errors import ErrorCode, SubagentControlError
from controlplane.contract._usage import USAGE, usage_counts

if TYPE_CHECKING:
    from controlplane.contract._services import ActivationFacts

_R = TypeVar("_R")

__all__ = [
    "BUDGET_EXHAUSTED_STATUS",
    "LIMITS",
    "MODEL_CALL",
    "TOOL_CALL",
    "TOOL_ROUND",
    "Budget",
    "BudgetPort",
    "FencedCall",
    "SpendGate",
    "Spent",
    "TurnGate",
    "budget_of",
    "limit_text",
    "spent_in",
]

BUDGET_EXHAUSTED_STATUS: Final = "budget_exhausted"
"""The ``status`` of the ``turn/end`` of a turn a budget (or the tool-round cap) stopped."""

MODEL_CALL: Final = "model"
"""`SpendGate.check`'s call: the loop is about to call the model."""
TOOL_ROUND: Final = "tool_round"
"""`SpendGate.check`'s call: the loop is about to run the tool calls of one reply."""
TOOL_CALL: Final = "tool"
"""`SpendGate.check`'s call: the loop is about to run one tool call."""

LIMITS: Final = ("tokens", "cost", "model_calls", "tool_calls", "seconds")
"""A budget's limits, in the order they are checked and named."""
_WHOLE: Final = frozenset({"tokens", "model_calls", "tool_calls"})
_NOUNS: Final = {
    "tokens": "token",
    "cost": "cost",
    "model_calls": "model call",
    "tool_calls": "tool call",
    "seconds": "wall-clock seconds",
}


class Budget(BaseModel):
    """Limits on what a child (with its descendants), or a parent session, may spend.

    Attributes:
        tokens: Input plus output tokens.
        cost: Cost, in the unit of the prices that priced it.
        model_calls: Model calls.
        tool_calls: Tool calls.
        seconds: Wall-clock seconds of its turns (each turn from its activation's start to
            its end, plus the running turn's time so far).

    Each is optional (None: no limit) and, when set, greater than 0.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a limit that is not a number > 0 (zero,
            negative, NaN, infinite, a bool, a string; a fraction for a count) or an
            unknown field.
    """

    # `model_calls` is a public name: pydantic before 2.10 warns about the ``model_`` prefix.
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    tokens: int | None = None
    cost: float | None = None
    model_calls: int | None = None
    tool_calls: int | None = None
    seconds: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, value: Any) -> Any:
        # A coded error, not a pydantic ValidationError, as for `Usage`: a bad limit is the
        # caller's input, refused at the call.
        if not isinstance(value, Mapping):
            return value
        unknown = sorted(str(key) for key in value if key not in LIMITS)
        if unknown:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a budget has no limit {unknown[0]!r}; its limits: {', '.join(LIMITS)}",
            )
        for name in LIMITS:
            limit = value.get(name)
            if limit is not None:
                problem = _limit_problem(name, limit)
                if problem is not None:
                    raise SubagentControlError(
                        ErrorCode.INVALID_INPUT, f"budget {name} {problem}; nothing was changed"
                    )
        return value

    def limits(self) -> dict[str, float]:
        """The limits that are set, by name: also the JSON form kept in the descriptor and
        the store."""
        return {name: limit for name in LIMITS if (limit := getattr(self, name)) is not None}


def _limit_problem(name: str, limit: object) -> str | None:
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        return f"must be a number greater than 0, not {type(limit).__name__}"
    if not math.isfinite(limit) or limit <= 0:
        return f"must be a finite number greater than 0, not {limit!r}"
    if name in _WHOLE and limit != int(limit):
        return f"must be a whole number, not {limit!r}"
    return None


def budget_of(value: object, *, what: str = "budget") -> Budget | None:
    """``value`` as a `Budget`: a `Budget`, a mapping of its limits, or None.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` naming ``what`` for anything else.
    """
    if value is None or isinstance(value, Budget):
        return value
    if isinstance(value, Mapping):
        try:
            return Budget.model_validate(dict(value))
        except SubagentControlError:
            raise
        except ValueError as exc:  # pydantic's own, for a value its types refuse
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"{what} is not a valid budget: {exc}"
            ) from exc
    raise SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"{what} must be a Budget, a mapping of its limits or None, not {type(value).__name__}",
    )


@dataclass(frozen=True, slots=True)
class Spent:
    """What one scope has spent, as its budget counts it."""

    tokens: int = 0
    cost: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    seconds: float = 0.0

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            self.tokens + other.tokens,
            self.cost + other.cost,
            self.model_calls + other.model_calls,
            self.tool_calls + other.tool_calls,
            self.seconds + other.seconds,
        )

    def reached(self, budget: Budget, names: tuple[str, ...] = LIMITS) -> str | None:
        """The first limit among ``names`` this spend has reached (spent >= limit), named
        with its spend (`limit_text`); None while every one leaves room."""
        for name in names:
            limit = getattr(budget, name)
            if limit is not None and getattr(self, name) >= limit:
                return limit_text(name, limit, getattr(self, name))
        return None

    def passed(self, budget: Budget, fraction: float) -> str | None:
        """The first limit whose ``fraction`` this spend has passed, in words; or None."""
        for name, limit in budget.limits().items():
            spent = getattr(self, name)
            if spent >= fraction * limit:
                share = f"{100.0 * spent / limit:.0f}%"
                amount = f"{_number(spent)} of {_number(limit)}"
                return f"{share} of its {_NOUNS[name]} budget ({amount})"
        return None


def spent_in(datas: Iterable[object], seconds: float = 0.0) -> Spent | None:
    """What events whose ``data`` are ``datas`` record spending (their ``data["usage"]``,
    read by `usage_counts`: an entry that is not a usage counts nothing), plus
    ``seconds``; None when they record nothing."""
    tokens = model_calls = tool_calls = 0
    cost = 0.0
    found = False
    for data in datas:
        if not isinstance(data, dict):
            continue
        counts = usage_counts(data.get(USAGE))
        if counts is None:
            continue
        tokens += counts[0] + counts[1]
        model_calls += counts[4]
        tool_calls += counts[5]
        if counts[6] is not None:
            cost += counts[6]
        found = True
    if not found and not seconds:
        return None
    return Spent(tokens, cost, model_calls, tool_calls, float(seconds))


def limit_text(name: str, limit: float, spent: float) -> str:
    """A reached limit in words: ``token budget of 10000 spent: 10412``."""
    return f"{_NOUNS[name]} budget of {_number(limit)} spent: {_number(spent)}"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}" if abs(value) >= 1 else f"{value:.4f}".rstrip("0")


@runtime_checkable
class SpendGate(Protocol):
    """What a run asks before each call (`StartRequest.gate`): ``check(MODEL_CALL)`` before
    a model call, ``check(TOOL_ROUND)`` before it runs one reply's tool calls,
    ``check(TOOL_CALL)`` before each of them. A refused call must not start: the run ends
    its turn and lets the error out of ``result()``.

    Raises (``check``):
        SubagentControlError: ``BUDGET_EXHAUSTED``, its message naming the limit and the
            spend; every later check of the turn raises it again.
    """

    def check(self, call: str) -> None: ...


class TurnGate(SpendGate, Protocol):
    """The gate as the activation that owns it sees it."""

    @property
    def exhausted(self) -> str | None:
        """Why a check refused a call this turn (the Task's detail), or None."""
        ...

    def elapsed_s(self) -> float:
        """The turn's wall-clock time so far (what its end adds to the ``seconds`` spend)."""
        ...

    def ended(self) -> None:
        """The turn is over: send a soft notice its last call earned, if any."""
        ...


class FencedCall(Protocol):
    """Runs one store call on an activation's path as its transcript's writes run:
    refused once its runtime fenced the activation, abandoned at once if it is waiting
    when the fence comes."""

    def __call__(self, call: Callable[[], _R], /) -> _R: ...


class BudgetPort(Protocol):
    """The budgets as the actors use them (built by the control plane)."""

    def gate(
        self,
        view: ActivationFacts,
        *,
        label: str,
        own: Budget | None,
        held: Callable[[], Spent],
        fenced: FencedCall | None = None,
    ) -> TurnGate:
        """The gate of the activation ``view`` shows (its child, Task and parent session
        read from there). ``label``: its Task's, for the notices; ``own``: its
        descriptor's budget, which holds until the store has the child's own; ``held()``:
        what its run has spent that the store does not count yet (writes held until
        publication); ``fenced``: what each of its store calls runs inside (none when a
        check is answered from the rows its run's appends left)."""
        ...

    def check_resume(self, child_id: str) -> None:
        """Refuse a resume of a child whose (or whose ancestor's, or session's) budget has
        a limit reached.

        Raises:
            SubagentControlError: ``BUDGET_EXHAUSTED``, nothing delivered.
        """
        ...
