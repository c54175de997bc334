"""Approvals over A2A: a Task in ``input-required`` carries its approval
request in its status message, and a reply to that Task answers it.

The status message has two parts: a sentence a person reads (the tool, its arguments,
the reason, how to answer) and a data part a program reads (``request_id``, ``tool``,
``arguments``, ``reason``). A reply is an answer when it says allow or deny: a data part
(``{"allow": true, "note": "…"}``, or ``{"decision": "allow"}``), or plain words
(``allow``, ``approve``, ``yes`` / ``deny``, ``reject``, ``no``, the rest of the text
being the note). Anything else is refused, saying how to answer: a reply to a waiting
Task is never stored as a steer.
"""

from __future__ import annotations

import json
from typing import Any, Final

from a2a.types.a2a_pb2 import Message, Part, Role
from a2a.utils.errors import InvalidParamsError
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

from controlplane.contract import ApprovalRequest, TaskSnapshot

__all__ = ["Verdict", "request_message", "verdict_of"]

_ALLOW: Final = frozenset({"allow", "allowed", "approve", "approved", "yes", "y", "ok"})
_DENY: Final = frozenset({"deny", "denied", "reject", "rejected", "no", "n"})
_DECISIONS: Final = {"allow": True, "approve": True, "deny": False, "reject": False}


class Verdict:
    """An answer read from a reply: allow or deny, and a note for the child's model."""

    __slots__ = ("allow", "note")

    def __init__(self, allow: bool, note: str | None) -> None:
        self.allow = allow
        self.note = note


def request_message(snapshot: TaskSnapshot, request: ApprovalRequest) -> Message:
    """The status message of a Task waiting on ``request``: words, then the request as data."""
    arguments = json.dumps(request.arguments, ensure_ascii=False, sort_keys=True)
    reason = f" ({request.reason})" if request.reason else ""
    words = (
        f"approval needed: {request.tool} {arguments}{reason}. Reply to this task with "
        "'allow' or 'deny' (and a note), or a data part {\"allow\": true|false, \"note\": …}."
    )
    data = Value()
    json_format.ParseDict(
        {
            "request_id": request.id,
            "tool": request.tool,
            "arguments": request.arguments,
            "reason": request.reason,
        },
        data,
    )
    return Message(
        message_id=f"{snapshot.id}:request:{request.id}",
        context_id=snapshot.child_id or "",
        task_id=snapshot.id,
        role=Role.ROLE_AGENT,
        parts=[Part(text=words), Part(data=data, media_type="application/json")],
    )


def verdict_of(message: Message, request: ApprovalRequest) -> Verdict:
    """What a reply to a Task waiting on ``request`` answers.

    Raises:
        InvalidParamsError: the reply says neither allow nor deny (nothing was delivered).
    """
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            found = _from_data(json_format.MessageToDict(part.data))
            if found is not None:
                return found
        elif kind == "text":
            texts.append(part.text)
    words = " ".join(texts).strip()
    first, _, rest = words.partition(" ")
    key = first.strip(".,:;!").lower()
    if key in _ALLOW or key in _DENY:
        note = rest.strip(" -—:,") or None
        return Verdict(allow=key in _ALLOW, note=note)
    raise InvalidParamsError(
        message=f"this task waits for an answer to approval request {request.id} "
        f"({request.tool}): reply 'allow' or 'deny' (words, or a data part "
        '{"allow": true|false, "note": …}); nothing was delivered'
    )


def _from_data(data: Any) -> Verdict | None:
    if not isinstance(data, dict):
        return None
    allow = data.get("allow")
    if not isinstance(allow, bool):
        decision = data.get("decision")
        allow = _DECISIONS.get(decision.lower()) if isinstance(decision, str) else None
    if allow is None:
        return None
    note = data.get("note")
    return Verdict(allow=allow, note=note if isinstance(note, str) and note else None)
