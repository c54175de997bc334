"""`ScriptedModel`: a deterministic model adapter for the demo and the tests."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence

from controlplane.contract import CancelSignal, ErrorCode, SubagentControlError, Usage
from controlplane.providers._model import ModelReply, ModelRequest

__all__ = ["ScriptedModel", "ScriptedReply"]

_KEEP_CALLS = 1000
"""How many of its latest requests a `ScriptedModel` keeps by default."""

ScriptedReply = str | ModelReply | Exception
"""One scripted step: a reply text, a full reply (to script a stop reason or tool calls:
``ModelReply(tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1})])``), or an
error to raise from that call."""

ScriptedUsage = Usage | Mapping[str, object] | None
"""What one scripted call reports spending: a `Usage`, its fields as a mapping
(``{"input_tokens": 12}``), or None for a call that reports nothing."""


class ScriptedModel:
    """A `ModelAdapter` that serves fixed replies, in order, and records its calls.

    Call ``n`` (counted from 0 across every child using this model, in the order the calls
    start) is served ``replies[n]``; past the end it repeats the last reply, or echoes the
    last user message (``"echo: <text>"``) when ``echo`` is set or no replies were given.
    A `ModelReply` entry scripts a stop reason or tool calls (the loop runs them and calls
    again, which takes the next entry); an exception entry is raised by that call.

    Usage, as a server would report it, comes from a `ModelReply` entry's own ``usage``,
    else from ``usage``: one value for every call, or a sequence with one entry per reply
    (a repeated last reply repeats its usage; an echo past the end reports the single
    value, or nothing). Without either, calls report no usage, like a server that sends
    none.

    Every call is counted (`call_count`); the requests themselves are kept for the most
    recent ``keep_calls`` calls (`calls`), so a test can inspect what a child was sent
    while a demo model in a long-lived process does not grow without bound.

    Args:
        replies: The scripted replies.
        echo: Echo once the replies are used up, instead of repeating the last one.
        delay_s: How long each call takes; waits on the call's signal, so a kill ends it.
        gated: Each call blocks until the test lets it through with `release`.
        usage: What each call reports spending (see above).
        keep_calls: How many of the latest requests `calls` keeps (default 1,000).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a negative ``delay_s``, a usage that is
            not valid (a negative count, …), a usage sequence whose length is not the
            number of replies, or a ``keep_calls`` below 1.
    """

    def __init__(
        self,
        replies: Sequence[ScriptedReply] | None = None,
        *,
        echo: bool = False,
        delay_s: float = 0.0,
        gated: bool = False,
        usage: ScriptedUsage | Sequence[ScriptedUsage] = None,
        keep_calls: int = _KEEP_CALLS,
    ) -> None:
        if isinstance(keep_calls, bool) or not isinstance(keep_calls, int) or keep_calls < 1:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"keep_calls must be an integer >= 1, got {keep_calls!r}"
            )
        if delay_s < 0:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"delay_s must be >= 0 seconds, got {delay_s!r}"
            )
        self._replies = list(replies or [])
        self._usage_each, self._usage_per_reply = _scripted_usage(usage, len(self._replies))
        self._echo = echo or not self._replies
        self._delay_s = delay_s
        self._gated = gated
        # One condition guards the call log and the gate permits; waiters are tests
        # (`wait_for_calls`) and gated calls.
        self._cond = threading.Condition()
        self._calls: deque[ModelRequest] = deque(maxlen=keep_calls)
        self._count = 0  # every call started, kept or not
        self._permits = 0

    @property
    def calls(self) -> list[ModelRequest]:
        """The latest requests this model was called with (at most ``keep_calls``), oldest
        first (a copy)."""
        with self._cond:
            return list(self._calls)

    @property
    def call_count(self) -> int:
        """How many calls have started."""
        with self._cond:
            return self._count

    def release(self, n: int = 1) -> None:
        """Let ``n`` more gated calls through (calls not yet started count too)."""
        if n < 1:
            raise SubagentControlError(ErrorCode.INVALID_INPUT, f"release n must be >= 1, got {n}")
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def wait_for_calls(self, n: int, timeout_s: float = 5.0) -> bool:
        """Block until at least ``n`` calls have started; returns False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= n, timeout=timeout_s)

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        """Serve the next scripted reply (see the class docstring).

        Raises:
            SubagentControlError: ``CANCELLED`` when ``signal`` aborts before the reply.
            Exception: a scripted exception entry.
        """
        # Registered before taking the condition: add_callback runs at once when the
        # signal is already aborted, and the wake-up must reach a gated wait either way.
        signal.add_callback(self._wake)
        with self._cond:
            index = self._count
            self._count += 1
            self._calls.append(request)
            self._cond.notify_all()
            if self._gated:
                self._cond.wait_for(lambda: self._permits > 0 or signal.aborted)
                if not signal.aborted:
                    self._permits -= 1
        if self._delay_s:
            signal.wait(self._delay_s)
        if signal.aborted:
            raise SubagentControlError(
                ErrorCode.CANCELLED, f"the scripted model call was cancelled: {signal.reason}"
            )
        return self._reply(index, request)

    def _reply(self, index: int, request: ModelRequest) -> ModelReply:
        usage = self._usage_each
        if index < len(self._replies) or not self._echo:
            at = min(index, len(self._replies) - 1)
            step = self._replies[at]
            if self._usage_per_reply is not None:
                usage = self._usage_per_reply[at]
        else:
            last_user = next((m.text for m in reversed(request.messages) if m.role == "user"), "")
            step = f"echo: {last_user}"
        if isinstance(step, Exception):
            raise step
        if isinstance(step, ModelReply):
            if step.usage is None and usage is not None:
                return step.model_copy(update={"usage": usage})
            return step
        return ModelReply(text=step, usage=usage)

    def _wake(self, _reason: str) -> None:
        with self._cond:
            self._cond.notify_all()

    def __repr__(self) -> str:
        return f"<ScriptedModel {len(self._replies)} replies, {self.call_count} calls>"


def _scripted_usage(
    usage: ScriptedUsage | Sequence[ScriptedUsage], replies: int
) -> tuple[Usage | None, list[Usage | None] | None]:
    """``usage`` checked: (one usage for every call, None) or (None, one per reply)."""
    if usage is None or isinstance(usage, Usage | Mapping):
        return _one_usage(usage), None
    if isinstance(usage, str | bytes) or not isinstance(usage, Sequence):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"usage must be a Usage, a mapping, None or a sequence of those, "
            f"not {type(usage).__name__}",
        )
    if len(usage) != replies:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"usage has {len(usage)} entries for {replies} replies; give one per reply",
        )
    return None, [_one_usage(entry) for entry in usage]


def _one_usage(usage: ScriptedUsage) -> Usage | None:
    if usage is None or isinstance(usage, Usage):
        return usage
    if isinstance(usage, Mapping):
        return Usage.model_validate(dict(usage))  # a bad count: INVALID_INPUT
    raise SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"a usage entry must be a Usage, a mapping or None, not {type(usage).__name__}",
    )
