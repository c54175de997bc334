"""The client side of one ACP activation: what the agent's updates become, and its process.

`AcpRecorder` is the ``acp.Client`` the agent talks to: it turns ``session/update``
notifications into the child's transcript (``assistant/message`` per message, ``tool/call``
and ``tool/result``) and answers permission requests by policy. It writes on a thread of
its own, in arrival order, so the run's event loop never waits for the transcript's lock
(which a steer holds while it waits for that loop to read the agent's answer). The process
helpers start the agent in its own process group and always reap it, and whatever it
started (`controlplane.providers._acp_guard` covers the case where this process does not
live to).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from controlplane.contract import (
    ApprovalDesk,
    EventKind,
    JsonValue,
    SessionEvent,
    StopReason,
    SubagentControlError,
    TranscriptWriter,
    Usage,
    usage_data,
)
from controlplane.providers._chat_history import (
    TOOL_CALL,
    TOOL_RESULT,
    chat_history,
    counted_tool_result,
)
from controlplane.providers._child_tools import bounded

__all__ = [
    "EXIT_ON_EOF_S",
    "SESSION_EVENT",
    "USAGE_EVENT",
    "AcpRecorder",
    "PermissionPolicy",
    "StderrTail",
    "primer",
    "reap",
    "spawn",
    "stop_reason_of",
]

log = logging.getLogger("controlplane.acp")

SESSION_EVENT = "acp/session"
"""Event kind: the agent's session id for this child (``session_id``), written at creation."""

USAGE_EVENT = "acp/usage"
"""Event kind: an ACP turn's usage (or ``usage_reported: false``), when the turn ended with
no message left to carry it."""

PermissionPolicy = Literal["deny", "allow", "ask"]

_STOP_REASONS = {
    "end_turn": StopReason.COMPLETED.value,
    "max_tokens": StopReason.MAX_TOKENS.value,
    "refusal": StopReason.REFUSAL.value,
    "cancelled": StopReason.ABORTED.value,
    "max_turn_requests": "max-turn-requests",
}
_PRIMER_CHARS = 100_000
EXIT_ON_EOF_S = 0.1
"""How long `reap` lets an agent whose stdin it closed exit on its own before SIGTERM."""
_STDERR_LINES_LOGGED = 200
_WRITER_PREFIX = "subagent-acp-writes"


def stop_reason_of(acp_reason: str) -> str:
    """Our stop reason for an ACP ``stopReason``."""
    return _STOP_REASONS.get(acp_reason, acp_reason)


def primer(events: Sequence[SessionEvent]) -> str:
    """The child's earlier conversation as text, for an agent that cannot load its session."""
    lines = []
    for message in chat_history(events):
        who = {"user": "User", "assistant": "You", "tool": "Tool result"}[message.role]
        calls = "".join(f"\n[you called {c.name} {c.arguments}]" for c in message.tool_calls)
        lines.append(f"{who}: {message.text}{calls}")
    text = "\n\n".join(lines)
    if len(text) > _PRIMER_CHARS:
        text = "…[earlier turns left out]\n" + text[-_PRIMER_CHARS:]
    return (
        "You are continuing an earlier conversation; its transcript follows. "
        f"Answer the next message in its light.\n\n{text}"
    )


class AcpRecorder:
    """The ``acp.Client`` of one activation: records what the agent does once ``recording``."""

    def __init__(
        self,
        transcript: TranscriptWriter,
        permission: PermissionPolicy,
        *,
        desk: ApprovalDesk | None = None,
    ) -> None:
        self.recording = False  # off while session/load replays the old conversation
        self.output = ""  # the last non-empty message of the turn
        self.failure: Exception | None = None  # a write that failed; fails the turn
        self._transcript = transcript
        self._permission = permission
        self._desk = desk  # where an ``ask`` policy asks
        self._text: list[str] = []
        self._message_id: str | None = None
        self._open_calls: set[str] = set()
        # One thread: the writes keep the order their updates arrived in (it starts on the
        # first write, so a recorder that writes nothing starts none).
        self._writes = concurrent.futures.ThreadPoolExecutor(1, _WRITER_PREFIX)

    async def session_update(self, session_id: str, update: Any, **_meta: Any) -> None:
        if not self.recording or self.failure is not None:
            return
        # Submitted before the first await: in the order the notifications arrived.
        await self.write(self._record_safely, update)

    async def write(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)``, a transcript write, on the recorder's writer thread."""
        await asyncio.get_running_loop().run_in_executor(self._writes, fn, *args)

    def close(self) -> None:
        """Wait for the writes in flight and end the writer thread."""
        self._writes.shutdown(wait=True)

    def _record_safely(self, update: Any) -> None:
        if self.failure is not None:
            return
        try:
            self._record(update)
        except Exception as exc:  # the acp library would only log it
            self.failure = exc

    async def request_permission(
        self, options: list[Any], session_id: str, tool_call: Any, **_meta: Any
    ) -> Any:
        from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

        if self._permission == "ask" and self._desk is not None:
            allow = await self._ask(tool_call)
            if allow is None:
                return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        else:
            allow = self._permission == "allow"
        kinds = ("allow_once", "allow_always") if allow else ("reject_once", "reject_always")
        chosen = next((o for o in options if o.kind in kinds), None)
        log.info(
            "ACP permission %s for %r: %s",
            "granted" if allow and chosen else "refused",
            getattr(tool_call, "title", None),
            chosen.option_id if chosen else "cancelled",
        )
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    async def _ask(self, tool_call: Any) -> bool | None:
        """Ask the child's parent and wait for the answer, live: the agent waits
        in its own process, so the run cannot park. None when the wait ended unanswered
        (killed, closing): the agent is told the request was cancelled."""
        desk = self._desk
        assert desk is not None
        await self.write(self.flush)  # the message before it comes first in the transcript
        title = getattr(tool_call, "title", None) or "tool call"
        raw = getattr(tool_call, "raw_input", None)
        arguments = raw if isinstance(raw, dict) else {"input": raw} if raw is not None else {}
        loop = asyncio.get_running_loop()
        try:
            request_id = await loop.run_in_executor(
                self._writes,
                lambda: desk.ask(
                    tool=str(title)[:200],
                    arguments=_plain(arguments),
                    call_id=str(getattr(tool_call, "tool_call_id", "") or ""),
                    parkable=False,
                ),
            )
            # Not on the writer thread: the agent's updates keep being written meanwhile.
            answer = await loop.run_in_executor(None, lambda: desk.wait(request_id, park=False))
        except SubagentControlError as exc:
            log.info("ACP permission for %r not answered: %s", title, exc.message)
            return None
        return None if answer is None else answer.allow

    def flush(self) -> None:
        """Write the message being streamed, if any (a new message or a tool call is a
        message boundary)."""
        text = "".join(self._text)
        self._text = []
        if text:
            self._transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": text})
            self.output = text

    def end_turn(self, reported: Any) -> None:
        """Write the turn's last message with what the agent reported the turn spent
        (``PromptResponse.usage``; None: ``usage_reported: false``, never zeros).

        ACP reports usage per prompt turn, not per model call, so it rides with the turn's
        last message, or in a `USAGE_EVENT` of its own when the turn ended on a tool call.
        The agent's model calls are not visible here: ``model_calls`` stays 0.
        """
        record = usage_data(_acp_usage(reported))
        text = "".join(self._text)
        self._text = []
        if text:
            self._transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": text, **record})
            self.output = text
        else:
            self._transcript.append(USAGE_EVENT, record)

    def _record(self, update: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk":
            message_id = getattr(update, "message_id", None)
            if message_id != self._message_id:
                self.flush()
                self._message_id = message_id
            text = getattr(update.content, "text", None)
            if isinstance(text, str):
                self._text.append(text)
        elif kind == "tool_call":
            self.flush()
            self._open_calls.add(update.tool_call_id)
            data = {"id": update.tool_call_id, "name": update.title, "arguments": update.raw_input}
            self._transcript.append(TOOL_CALL, _json(data))
        elif kind == "tool_call_update" and update.status in ("completed", "failed"):
            if update.tool_call_id not in self._open_calls:
                return  # a result already recorded, or for a call never announced
            self.flush()
            self._open_calls.discard(update.tool_call_id)
            text = bounded(_tool_text(update))
            outcome = "output" if update.status == "completed" else "error"
            self._transcript.append(
                TOOL_RESULT, counted_tool_result({"id": update.tool_call_id, outcome: text})
            )


def _acp_usage(reported: Any) -> Usage | None:
    """Our `Usage` for an ACP ``PromptResponse.usage`` (still marked unstable in the ACP
    schema, which documents it as the turn's): ``thought_tokens`` are reasoning tokens,
    ``cached_read_tokens`` cached input. None when there is none or it is not counts."""
    if reported is None:
        return None
    counts = {
        "input_tokens": getattr(reported, "input_tokens", None),
        "output_tokens": getattr(reported, "output_tokens", None),
        "cached_input_tokens": getattr(reported, "cached_read_tokens", None),
        "reasoning_tokens": getattr(reported, "thought_tokens", None),
    }
    try:
        return Usage.model_validate({k: v for k, v in counts.items() if v is not None})
    except SubagentControlError as exc:
        log.warning("the ACP agent reported a usage that is not counts (%s); ignored", exc)
        return None


def _tool_text(update: Any) -> str:
    texts = [
        block.content.text
        for block in getattr(update, "content", None) or []
        if isinstance(getattr(getattr(block, "content", None), "text", None), str)
    ]
    if texts:
        return "\n".join(texts)
    raw = getattr(update, "raw_output", None)
    return "" if raw is None else json.dumps(raw, default=str)


def _json(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("arguments") is None:
        data["arguments"] = {}
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return plain


class StderrTail:
    """Drains the agent's stderr into the log (bounded) and keeps its last lines."""

    def __init__(self, name: str) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=10)
        self._name = name
        self._logged = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            async for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip()[:1000]
                self.lines.append(line)
                if self._logged < _STDERR_LINES_LOGGED:
                    self._logged += 1
                    log.info("ACP agent %s: %s", self._name, line)

    def text(self) -> str:
        return " | ".join(self.lines) or "(nothing on stderr)"


async def spawn(
    command: Sequence[str], cwd: str | None, env: Mapping[str, str] | None
) -> asyncio.subprocess.Process:
    """Start the agent with pipes, in a process group of its own (so it can be reaped whole)."""
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        start_new_session=True,
        limit=16 * 1024 * 1024,
    )


async def reap(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """End the agent and wait for it, then kill whatever is left in its process group.

    EOF on its stdin, then SIGTERM to its group once it had `EXIT_ON_EOF_S` to leave on its
    own, then SIGKILL after ``grace_s``. The turn is over when this runs (it answered, or was
    cancelled), so an agent that ignores EOF — a server that outlives its client — is not
    waited for the whole grace period: SIGTERM is the request to exit, and the grace period
    is what it gets to honour it. A cancellation of the caller does not skip a step: it
    jumps straight to SIGKILL (then re-raises), so nothing outlives the run.
    """
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            process.stdin.close()
    try:
        for sig, wait_s in (
            (None, min(EXIT_ON_EOF_S, grace_s)),
            (signal.SIGTERM, grace_s),
            (signal.SIGKILL, None),
        ):
            if sig is not None:
                _signal_group(process.pid, sig)
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), wait_s)
                break
            except TimeoutError:
                continue
    finally:
        # Its grandchildren (or, when cancelled, the agent too): the child watcher reaps it.
        _signal_group(process.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _plain(value: object) -> dict[str, JsonValue]:
    """An agent's raw tool input as a storable JSON object (what it cannot hold, as text)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    plain = json.loads(text.encode("utf-8", "replace").decode("utf-8"))
    return plain if isinstance(plain, dict) else {"input": plain}
