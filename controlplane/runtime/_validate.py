"""The checks a public call makes of its arguments before anything starts, in one home (the
facade's and the async facade's), and the translation of a failure inside the actor system
into the caller's coded error: what a caller is told stays the same whichever door it
came in by, and the facade reads as wiring plus the public calls.

The text, seconds and JSON checks these build on are the contract's (`storable_text`,
`seconds_problem`, `count_problem`, `plain_json`): the actors and the store use them too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from controlplane.contract import (
    ErrorCode,
    SubagentControlError,
    count_problem,
    plain_json,
    seconds_problem,
    storable_text,
)

# The contract's pydantic models are imported in the functions that use them: the facade
# imports these checks, and the public import builds no model (tests/test_import_cost.py).
if TYPE_CHECKING:
    from controlplane.contract import (
        Budget,
        ContinuableStartSpec,
        Descriptor,
        MessageSource,
        NewEvent,
        TextBlock,
    )

__all__ = [
    "StartInputs",
    "check_child_id",
    "check_option",
    "check_options",
    "check_source",
    "check_start_spec",
    "check_timeout",
    "message_blocks",
    "start_inputs",
    "translate",
]

_MIN_PASSIVATE_S = 0.05
_MIN_LEASE_TTL_S = 0.3


class StartInputs(NamedTuple):
    """What a start takes from its spec, checked: the child's descriptor, its seed events
    and its prompt."""

    descriptor: Descriptor
    seed: tuple[NewEvent, ...]
    prompt: tuple[TextBlock, ...]


def check_option(name: str, problem: str | None) -> None:
    """Raise ``INVALID_INPUT`` naming the option when a ``*_problem`` check found one."""
    if problem is not None:
        raise SubagentControlError(ErrorCode.INVALID_INPUT, f"{name} {problem}")


def check_options(
    *,
    close_timeout_s: object,
    passivate_after_s: object,
    max_live_activations: object,
    lease_ttl_s: object,
    recent_tasks: object,
) -> None:
    """The control plane's options (`SubagentControl`'s constructor): ``INVALID_INPUT``
    naming the first one that is off, before anything is built."""
    # 0 is a grace of none: running turns are handed over at once.
    if close_timeout_s != 0 or isinstance(close_timeout_s, bool):
        check_option("close_timeout_s", seconds_problem(close_timeout_s))
    if passivate_after_s is not None:
        problem = seconds_problem(passivate_after_s, at_least=_MIN_PASSIVATE_S)
        check_option("passivate_after_s", problem and f"{problem}, or None")
    if max_live_activations is not None:
        problem = count_problem(max_live_activations)
        check_option("max_live_activations", problem and f"{problem}, or None")
    check_option("lease_ttl_s", seconds_problem(lease_ttl_s, at_least=_MIN_LEASE_TTL_S))
    check_option("recent_tasks", count_problem(recent_tasks, at_least=0))


def check_recovery(recover: object, max_recoveries: object) -> None:
    """``recover`` (a bool) and ``max_recoveries`` (a count, 0 or more): ``INVALID_INPUT``
    naming the first that is off."""
    if not isinstance(recover, bool):
        check_option("recover", f"must be True or False, not {recover!r}")
    check_option("max_recoveries", count_problem(max_recoveries, at_least=0))


def check_start_spec(spec: object) -> ContinuableStartSpec:
    """The start's argument, if it is a `ContinuableStartSpec` (``INVALID_INPUT`` if not)."""
    from controlplane.contract import ContinuableStartSpec

    if not isinstance(spec, ContinuableStartSpec):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, "start_continuable takes a ContinuableStartSpec"
        )
    return spec


def start_inputs(
    spec: ContinuableStartSpec, *, default_budget: Budget | None = None
) -> StartInputs:
    """Check what a start will write (``INVALID_DESCRIPTOR`` for its descriptor and seed,
    ``INVALID_INPUT`` for its label, prompt and budget), before any Task exists.
    ``default_budget`` is the child's budget when its spec sets none."""
    from controlplane.contract import NewEvent, budget_of

    budget = budget_of(spec.budget) or default_budget
    descriptor = _snapshot_descriptor(spec, budget)
    seed = tuple(
        NewEvent(
            kind=event.kind,
            turn=0,
            data=plain_json(event.data, code=ErrorCode.INVALID_DESCRIPTOR, what="seed data"),
            source=event.source,
        )
        for event in spec.seed_events or ()
    )
    storable_text(spec.label, code=ErrorCode.INVALID_INPUT, what="label", max_chars=1000, nul=False)
    return StartInputs(descriptor, seed, message_blocks(spec.prompt))


def _snapshot_descriptor(spec: ContinuableStartSpec, budget: Budget | None) -> Descriptor:
    from controlplane.contract import AgentHandle, Descriptor

    model = spec.parent.model if isinstance(spec.parent, AgentHandle) else None
    return Descriptor.build(
        provider=spec.provider,
        agent_provider=spec.agent_provider or (model.provider if model else None),
        agent_model=spec.agent_model or (model.model if model else None),
        persona=spec.persona,
        tool_filter=spec.tool_filter,
        inputs=spec.inputs,
        budget=budget,
    )


def check_child_id(child_id: object) -> str:
    """A send's child id, if it could name a child (``INVALID_INPUT`` if not)."""
    if (
        child_id.__class__ is str
        and 0 < len(child_id) <= _ID_CHARS
        and child_id.isascii()
        and "\x00" not in child_id
    ):
        return child_id  # the usual id: what the checks below pass
    if not isinstance(child_id, str) or not child_id:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"{child_id!r} is not a child id; use the id you started"
        )
    storable_text(
        child_id, code=ErrorCode.INVALID_INPUT, what="child id", max_chars=_ID_CHARS, nul=False
    )
    return child_id


_ID_CHARS = 200


def message_blocks(message: object) -> tuple[TextBlock, ...]:
    """A message as the blocks a transcript can keep (``INVALID_INPUT`` if it is not).

    A ``str`` is one text block (text is the only block type); an empty or blank one is
    refused, as the model tools refuse it: it is a mistake, not a message. A list of
    `TextBlock` is taken as it is (an empty follow-up included)."""
    text_block = _models().TextBlock
    if message.__class__ is list or message.__class__ is tuple:
        # The usual message, `TextBlock` s of ASCII text: what the checks below pass.
        for item in message:
            if item.__class__ is not text_block:
                break
            text = item.text
            if text.__class__ is not str or not text.isascii():
                break
        else:
            return tuple(message)
    from pydantic import ValidationError

    from controlplane.contract import TextBlock

    if isinstance(message, str):
        if not message.strip():
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                "a message is a non-empty str or a list of TextBlock; this str is empty",
            )
        message = (TextBlock(text=message),)
    elif isinstance(message, (bytes, bytearray)) or not isinstance(message, Iterable):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"a message is a str or a list of TextBlock, not {type(message).__name__}",
        )
    try:
        blocks = tuple(
            item if isinstance(item, TextBlock) else TextBlock.model_validate(item)
            for item in message
        )
    except ValidationError as exc:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"a message block is not a TextBlock: {exc.errors()[0]['msg']}"
        ) from exc
    # Refused here, before any Task or delivery: a run must never take a message that its
    # transcript could not keep.
    for block in blocks:
        storable_text(block.text, code=ErrorCode.INVALID_INPUT, what="message text")
    return blocks


def check_source(source: object) -> MessageSource:
    """A message's source, if the store can keep it (``INVALID_INPUT`` if not)."""
    message_source = _models().MessageSource
    if source.__class__ is message_source:
        kind, sender = source.kind, source.sender_session_id
        if (
            kind.__class__ is str
            and kind.isascii()
            and "\x00" not in kind
            and (
                sender is None
                or (sender.__class__ is str and sender.isascii() and "\x00" not in sender)
            )
        ):
            return source  # ASCII text: what the checks below pass
    from controlplane.contract import MessageSource

    if not isinstance(source, MessageSource):
        raise SubagentControlError(ErrorCode.INVALID_INPUT, "source must be a MessageSource")
    storable_text(source.kind, code=ErrorCode.INVALID_INPUT, what="source kind", nul=False)
    if source.sender_session_id is not None:
        storable_text(
            source.sender_session_id, code=ErrorCode.INVALID_INPUT, what="sender id", nul=False
        )
    return source


class _Models(NamedTuple):
    TextBlock: type[TextBlock]
    MessageSource: type[MessageSource]


_loaded: list[_Models] = []


def _models() -> _Models:
    """The contract's models a send's checks compare classes with, imported once (a
    function-level import costs a lookup per call, and a steer makes several)."""
    if not _loaded:
        from controlplane.contract import MessageSource, TextBlock

        _loaded.append(_Models(TextBlock, MessageSource))
    return _loaded[0]


def check_timeout(timeout: float | None) -> None:
    """A wait's timeout: None, or a finite number of seconds >= 0 (``INVALID_INPUT``)."""
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}",
        )


def translate(exc: BaseException, consequence: str) -> BaseException:
    """A failure inside the actor system as the caller's coded error: the root gone is
    ``CLOSED``; anything unexpected is ``INTERNAL``. KeyboardInterrupt and SystemExit
    pass through untouched (they are the caller's own)."""
    if isinstance(exc, SubagentControlError) or not isinstance(exc, Exception):
        return exc
    import pykka  # loaded already: only the actor system raises what is translated here

    if isinstance(exc, (pykka.ActorDeadError, pykka.Timeout)):
        return SubagentControlError(
            ErrorCode.CLOSED, f"the control plane is closing; {consequence}"
        )
    return SubagentControlError(ErrorCode.INTERNAL, f"internal error ({exc}); {consequence}")


def check_concurrency(concurrency: object) -> dict[str, int]:
    """The ``concurrency`` option as a plain dict (``INVALID_INPUT`` for a key that is not
    a non-empty string, or a limit that is not an int of at least 1), before anything is
    built."""
    if not isinstance(concurrency, Mapping):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            "concurrency must be a mapping of 'provider' or 'provider:model' to a limit "
            f"(an int >= 1), not {type(concurrency).__name__}; nothing was opened",
        )
    limits: dict[str, int] = {}
    for key, limit in concurrency.items():
        if not isinstance(key, str) or not key.strip():
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"concurrency key {key!r} must be a provider name or 'provider:model'; "
                "nothing was opened",
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"concurrency[{key!r}] must be an int >= 1, not {limit!r}; nothing was opened",
            )
        limits[key] = limit
    return limits
