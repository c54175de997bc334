"""Tool calls across crashes: answering, when a child resumes, the calls its dead turn left open.

A tool call whose process died (or whose turn was killed) while the tool ran has a
``tool/call`` event and no ``tool/result``. Before the resumed turn's first model call, the
loop writes one result for each such call of the child's own earlier events, through the
run's transcript, so the answer is durable and every later rebuild reads the same one:

- a tool declared ``idempotent`` is run again, through the same gate check and the same
  `run_tool_call` as any call, and its real result is written with ``"rerun": true``
  (unless the call needs approval: it is never run again unasked);
- any other tool (or one the child no longer has) is not run: the result is an error saying
  the call was interrupted and may or may not have run, with ``"interrupted": true``.

Each result replaces the placeholder `chat_history` put right after its call, in the live
conversation as in a rebuilt one (the two stay identical). It runs in the loop thread, so a
kill stops it as it stops any tool call: a rerun whose result lost the race with the kill is
dropped, the call stays open, and the next resume answers it again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from controlplane.contract import TOOL_CALL as GATE_TOOL_CALL
from controlplane.contract import CancelSignal, SessionEvent, SpendGate, TranscriptWriter
from controlplane.providers._chat_history import (
    INTERRUPTED_TOOL_CALL,
    TOOL_RESULT,
    UnansweredCall,
    chat_history_with_unanswered,
    counted_tool_result,
    tool_message_text,
)
from controlplane.providers._child_tools import ChildTool, run_tool_call
from controlplane.providers._history_cache import HistoryCache
from controlplane.providers._model import ChatMessage, ToolCall

__all__ = ["INTERRUPTED", "RERUN", "answer_unanswered", "resumed_history"]

INTERRUPTED = "interrupted"
"""``tool/result`` data key: true on the error written for a call that was not run again."""
RERUN = "rerun"
"""``tool/result`` data key: true on the result of an idempotent call run again on resume."""


def resumed_history(
    opening: list[ChatMessage],
    events: Sequence[SessionEvent],
    *,
    cache: HistoryCache | None = None,
    child_id: str = "",
) -> tuple[list[ChatMessage], list[UnansweredCall]]:
    """A resumed child's conversation, ``opening`` then its own earlier ``events``, and the
    calls in those events no result answers, placed in that conversation.

    Only ``events`` are searched: a call in the opening (a fork's seed, the parent's) is
    not the child's to answer. With a ``cache``, the conversation of ``events`` goes on
    from the one rebuilt at child ``child_id``'s last resume, when ``events`` continue it.
    """
    if cache is not None:
        earlier, unanswered = cache.rebuild(child_id, events)
    else:
        earlier, unanswered = chat_history_with_unanswered(events)
    offset = len(opening)
    return opening + earlier, [dataclasses.replace(u, at=u.at + offset) for u in unanswered]


def answer_unanswered(
    unanswered: Sequence[UnansweredCall],
    history: list[ChatMessage],
    *,
    tools: Mapping[str, ChildTool],
    transcript: TranscriptWriter,
    gate: SpendGate | None,
    signal: CancelSignal,
) -> None:
    """Write a result for each call in ``unanswered`` and put it in ``history`` in place.

    Stops at the first call it reaches once ``signal`` has aborted, writing nothing more
    (the loop then ends the turn ``aborted``).

    Raises:
        SubagentControlError: what the gate raised before a rerun (``BUDGET_EXHAUSTED``: the
            call is neither run nor answered) or what the transcript writer raised.
    """
    for entry in unanswered:
        if signal.aborted:
            return
        call = entry.call
        tool = tools.get(call.name)
        if tool is not None and tool.idempotent and not _asks(tool, call):
            if gate is not None:
                gate.check(GATE_TOOL_CALL)
            outcome = run_tool_call(tools, call, signal)
            if signal.aborted:
                return  # lost the race with a kill: dropped, like any call's result
            data = counted_tool_result({**outcome.event_data(call.id), RERUN: True})
            text = tool_message_text(output=outcome.output, error=outcome.error)
        else:
            # Never run again: it may have done its work before the process died.
            data = {"id": call.id, "error": INTERRUPTED_TOOL_CALL, INTERRUPTED: True}
            text = tool_message_text(error=INTERRUPTED_TOOL_CALL)
        transcript.append(TOOL_RESULT, data)
        history[entry.at] = ChatMessage(role="tool", text=text, tool_call_id=call.id)


def _asks(tool: ChildTool, call: ToolCall) -> bool:
    """Whether the call needs approval (arguments that are not a JSON object: it asks)."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return True
    return not isinstance(arguments, dict) or tool.needs_approval(arguments)
