"""Tool calls that need approval, in the agent loop.

Before a call whose tool asks (`ChildTool.needs_approval`) runs, the loop asks the
activation's desk (``request.approvals``): the request is written, and the loop waits for
the answer — allowed, the tool runs once; denied, the model reads a result saying so, with
the answer's note. A wait past the control plane's grace period parks the run (`Parked`):
the loop ends, holding no thread, and the answer continues the turn in a new activation,
which reads the call it must go on with from the transcript (`continuation_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.contract import (
    ApprovalAnswer,
    ApprovalDesk,
    CancelSignal,
    ErrorCode,
    EventKind,
    JsonValue,
    SessionEvent,
    SubagentControlError,
    Suspended,
)
from controlplane.providers._chat_history import tool_call_data
from controlplane.providers._child_tools import ChildTool, ToolOutcome, bounded, run_tool_call
from controlplane.providers._model import ToolCall

__all__ = [
    "Continuation",
    "Parked",
    "approved_call",
    "continuation_of",
    "taken_call",
    "waits_on_request",
]


class Parked(Suspended):
    """The run parked on an approval request: the loop ends with ``input_required``."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a continued turn goes on with: the call waiting for its answer, and the calls
    of the same reply after it, not yet run."""

    request_id: str
    call: ToolCall
    pending: list[ToolCall]
    reason: str | None


def approved_call(
    tools: Mapping[str, ChildTool],
    call: ToolCall,
    rest: Sequence[ToolCall],
    *,
    desk: ApprovalDesk | None,
    reason: str | None,
    signal: CancelSignal,
) -> ToolOutcome:
    """Run ``call`` (already written as ``tool/call``), asking first if its tool needs it.

    Raises:
        Parked: the run parked while it waited for the answer.
        SubagentControlError: the desk could not ask (the turn fails or was killed).
    """
    tool = tools.get(call.name)
    arguments = _arguments(call)
    if tool is None or desk is None or arguments is None or not tool.needs_approval(arguments):
        # Unknown tools and unreadable arguments get their error result, unasked.
        return run_tool_call(tools, call, signal)
    request_id = desk.ask(
        tool=call.name,
        arguments=arguments,
        call_id=call.id,
        reason=reason,
        deadline_s=tool.approval_deadline_s,
        pending=[_stored_call(c) for c in rest],
    )
    return taken_call(tools, call, request_id, desk=desk, signal=signal)


def taken_call(
    tools: Mapping[str, ChildTool],
    call: ToolCall,
    request_id: str,
    *,
    desk: ApprovalDesk,
    signal: CancelSignal,
) -> ToolOutcome:
    """Wait for ``request_id``'s answer (parking past the grace period) and act on it:
    run the call once if allowed, a denial's error result if not.

    Raises:
        Parked: the run parked.
    """
    answer = desk.wait(request_id, park=True)
    if answer is None:
        raise Parked(request_id)
    if answer.allow:
        return run_tool_call(tools, call, signal)
    return ToolOutcome(error=bounded(denied_text(answer)))


def denied_text(answer: ApprovalAnswer) -> str:
    """What the model reads for a denied call."""
    source = answer.source
    who = {"human": "a person", "system": None}.get(source.kind, "the parent agent")
    text = "the call was not run: it was denied" + (f" by {who}" if who else "")
    if answer.note:
        text += f": {answer.note}"
    return text


def waits_on_request(open_turn: Sequence[SessionEvent]) -> bool:
    """Whether an open turn waits on an approval request (a parked turn, continued by its
    answer) rather than being one a runtime left mid-way (recovered)."""
    try:
        continuation_of(open_turn)
    except SubagentControlError:
        return False
    return True


def continuation_of(open_turn: Sequence[SessionEvent]) -> Continuation:
    """The call a continued turn goes on with: its open turn's newest request that has
    no answer yet.

    Raises:
        SubagentControlError: ``NOT_RESUMABLE`` when the turn waits on no request.
    """
    answered = {
        e.data.get("id")
        for e in open_turn
        if e.kind == EventKind.APPROVAL_ANSWER and isinstance(e.data, dict)
    }
    for event in reversed(open_turn):
        data = event.data
        if event.kind != EventKind.APPROVAL_REQUEST or not isinstance(data, dict):
            continue
        if data.get("id") in answered:
            break
        pending = data.get("pending")
        reason = data.get("reason")
        return Continuation(
            request_id=str(data["id"]),
            call=ToolCall(
                id=str(data["call_id"]),
                name=str(data["tool"]),
                arguments=json.dumps(data.get("arguments", {})),
            ),
            pending=[ToolCall.model_validate(c) for c in pending]
            if isinstance(pending, list)
            else [],
            reason=reason if isinstance(reason, str) else None,
        )
    raise SubagentControlError(
        ErrorCode.NOT_RESUMABLE,
        "the turn to continue waits on no approval request; send the child a message to "
        "continue it in a new turn",
    )


def _arguments(call: ToolCall) -> dict[str, JsonValue] | None:
    """The call's arguments as a storable JSON object (as its ``tool/call`` event keeps
    them: a lone surrogate made ``?``), or None when they are not one."""
    value = tool_call_data(call)["arguments"]
    return value if isinstance(value, dict) else None


def _stored_call(call: ToolCall) -> dict[str, JsonValue]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}
