"""An Agent Client Protocol agent for the tests, written from the protocol (JSON-RPC 2.0,
one JSON object per line over stdio), not from the client library it is tested against.

It answers ``initialize``, ``session/new``, ``session/load`` (with ``--load-session``: the
sessions live in ``--state DIR``, so another process can load them) and ``session/prompt``
(streaming ``agent_message_chunk`` updates: ``echo: <prompt>``, plus what it remembers of
the session, after ``--think`` seconds), and honours ``session/cancel``. Switches advertise
the newer session methods: ``--resume-session`` (``session/resume``: the session goes on,
nothing is replayed), ``--close-session`` (``session/close``) and ``--steering`` (the
``_session/steering`` extension, advertised in ``initialize``'s ``_meta``: messages injected
into the running turn, which its answer names; a prompt run with ``--wait-for-steer`` waits
for one, saying so in ``DIR/waiting``; ``--refuse-steering`` declines every one). An injected
message gets a reply of its own (``noted: <message>``) before the agent answers the
steering request. Flags make it misbehave on purpose: crash or
hang in a method (``--hang-if-exists FILE``: only while FILE exists), ignore cancellation,
SIGTERM or the end of its stdin, call a tool, ask for a permission, spawn a grandchild
process in its process group, or run as a wrapper (``--wrapper``: a process that spawns the
real agent on its own stdio and waits for it, as Codex's ACP adapter runs under node); one
reports a turn's usage in its prompt response (``--usage JSON``). Every
process appends its pid (and its grandchild's) to ``DIR/pids`` and every prompt it receives
to ``DIR/prompts.jsonl``, and every method it is called with (and the session) to
``DIR/methods.jsonl``, for the tests to check.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

_out_lock = threading.Lock()
_waiting: dict[Any, threading.Event] = {}
_answers: dict[Any, Any] = {}
_cancelled: dict[str, threading.Event] = {}
_running: set[str] = set()  # sessions whose prompt runs now
_steered: dict[str, list[str]] = {}  # per session: the messages injected into its turn
_steer_lock = threading.Condition()
STEERING = "_session/steering"


def send(message: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()


def update(session_id: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session_id, "update": body}})


def chunk(session_id: str, kind: str, text: str, message_id: str | None = None) -> None:
    body: dict[str, Any] = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if message_id:
        body["messageId"] = message_id
    update(session_id, body)


def ask(method: str, params: dict[str, Any]) -> Any:
    """Send a request to the client and wait for its answer."""
    request_id = f"agent-{uuid.uuid4().hex[:8]}"
    done = threading.Event()
    _waiting[request_id] = done
    send({"id": request_id, "method": method, "params": params})
    done.wait(30)
    return _answers.pop(request_id, None)


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = Path(args.state)
        self.state.mkdir(parents=True, exist_ok=True)

    def history(self, session_id: str) -> list[list[str]]:
        path = self.state / f"{session_id}.json"
        return json.loads(path.read_text()) if path.exists() else []

    def save(self, session_id: str, history: list[list[str]]) -> None:
        (self.state / f"{session_id}.json").write_text(json.dumps(history))

    def misbehave(self, method: str) -> None:
        if self.args.crash_on == method:
            print(f"acp_agent: crashing on {method} as asked", file=sys.stderr, flush=True)
            os._exit(3)
        if self.hangs_on(method) and method != "session/prompt":
            if self.args.announce:  # a FIFO the test reads: "I am stuck now"
                with open(self.args.announce, "w") as fifo:
                    fifo.write(f"hanging in {method}\n")
            threading.Event().wait()  # never answers

    def hangs_on(self, method: str) -> bool:
        if self.args.hang_on != method:
            return False
        return self.args.hang_if_exists is None or os.path.exists(self.args.hang_if_exists)

    def note(self, method: str, params: dict[str, Any]) -> None:
        with (self.state / "methods.jsonl").open("a") as log:
            log.write(json.dumps({"method": method, "session": params.get("sessionId")}) + "\n")

    def handle(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params") or {}
        if method is None:  # an answer to one of our requests
            _answers[message.get("id")] = message.get("result")
            if (done := _waiting.pop(message.get("id"), None)) is not None:
                done.set()
            return
        self.note(method, params)
        if method == "session/cancel":
            _cancelled.setdefault(params["sessionId"], threading.Event()).set()
            with _steer_lock:
                _steer_lock.notify_all()
            return
        self.misbehave(method)
        if method == STEERING and self.args.steering:
            result = self.on_steering(params)
        else:
            result = getattr(self, "on_" + method.replace("/", "_"))(params)
        send({"id": message["id"], "result": result})

    def on_initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        sessions: dict[str, Any] = {}
        if self.args.resume_session:
            sessions["resume"] = {}
        if self.args.close_session:
            sessions["close"] = {}
        answer: dict[str, Any] = {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": self.args.load_session,
                "sessionCapabilities": sessions,
            },
            "authMethods": [],
            "agentInfo": {"name": "test-agent", "version": "1.0"},
        }
        if self.args.steering:  # as claude-agent-acp advertises it
            answer["_meta"] = {"steering": {"supported": True}}
        return answer

    def on_session_resume(self, params: dict[str, Any]) -> dict[str, Any]:
        if not (self.state / f"{params['sessionId']}.json").exists():
            raise KeyError(params["sessionId"])
        return {}  # the session goes on where it was: nothing is replayed

    def on_session_close(self, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    def on_steering(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = params["sessionId"]
        texts = [b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text"]
        with _steer_lock:
            if self.args.refuse_steering or session_id not in _running:
                return {"outcome": "promptRequired", "reason": "noRunningTurn"}
            # A reply of its own before the answer: the client is asked to write while it
            # waits for that answer.
            chunk(session_id, "agent_message_chunk", f"noted: {' '.join(texts)}", "m-steer")
            _steered.setdefault(session_id, []).append(" ".join(texts))
            _steer_lock.notify_all()
        return {"outcome": "injected"}

    def on_session_new(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.save(session_id, [])
        return {"sessionId": session_id}

    def on_session_load(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = params["sessionId"]
        if not (self.state / f"{session_id}.json").exists():
            raise KeyError(session_id)
        for role, text in self.history(session_id):  # the replay a client must not record
            kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
            chunk(session_id, kind, text)
        return {}

    def on_session_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = params["sessionId"]
        texts = [b.get("text", "") for b in params["prompt"] if b.get("type") == "text"]
        with (self.state / "prompts.jsonl").open("a") as log:
            log.write(json.dumps({"session": session_id, "texts": texts}) + "\n")
        history = self.history(session_id)
        cancelled = _cancelled.setdefault(session_id, threading.Event())
        try:
            return self.answer(session_id, texts, history, cancelled)
        finally:
            with _steer_lock:
                _running.discard(session_id)

    def answer(
        self,
        session_id: str,
        texts: list[str],
        history: list[list[str]],
        cancelled: threading.Event,
    ) -> dict[str, Any]:
        if self.hangs_on("session/prompt"):
            chunk(session_id, "agent_message_chunk", "working on it")
            if self.args.ignore_cancel:
                threading.Event().wait()
            cancelled.wait()
            return {"stopReason": "cancelled"}
        if self.args.tool_call:
            update(
                session_id,
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": "tool-1",
                    "title": "read notes",
                    "kind": "read",
                    "status": "pending",
                    "rawInput": {"path": "notes.md"},
                },
            )
            update(
                session_id,
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": "tool-1",
                    "status": "completed",
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": "3 notes"}}
                    ],
                },
            )
        extra = ""
        if self.args.ask_permission:
            answer = ask(
                "session/request_permission",
                {
                    "sessionId": session_id,
                    "toolCall": {"toolCallId": "tool-2", "title": "delete everything"},
                    "options": [
                        {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            )
            extra = f" (permission: {json.dumps(answer.get('outcome') if answer else None)})"
        remembered = [text for role, text in history if role == "user"]
        reply = f"echo: {texts[-1] if texts else ''}"
        if self.args.wait_for_steer:
            chunk(session_id, "agent_message_chunk", "waiting for guidance", "m0")
            (self.state / "waiting").touch()  # for the tests: that chunk is on its way
            with _steer_lock:  # bounded: a test that never steers still ends
                _steer_lock.wait_for(
                    lambda: bool(_steered.get(session_id)) or cancelled.is_set(), timeout=30
                )
            if cancelled.is_set():
                return {"stopReason": "cancelled"}
        if self.args.think:  # a model at work, which a steer can reach meanwhile
            cancelled.wait(self.args.think)
        with _steer_lock:  # from here the turn takes no message: it answers those it took
            steered = _steered.pop(session_id, [])
            _running.discard(session_id)
        if steered or self.args.wait_for_steer:
            reply += f" (steered: {' | '.join(steered) or 'nothing'})"
        if remembered:
            reply += f" (remembered: {' | '.join(remembered)})"
        if len(texts) > 1:
            reply += f" (context blocks: {len(texts) - 1})"
        reply += extra
        for at in range(0, len(reply), 7):
            chunk(session_id, "agent_message_chunk", reply[at : at + 7], "m1")
        if self.args.crash_on == "after-reply":
            os._exit(4)
        self.save(session_id, [*history, ["user", texts[-1] if texts else ""], ["agent", reply]])
        if self.args.usage:
            return {"stopReason": self.args.stop_reason, "usage": json.loads(self.args.usage)}
        return {"stopReason": self.args.stop_reason}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--load-session", action="store_true")
    parser.add_argument("--crash-on")
    parser.add_argument("--hang-on")
    parser.add_argument("--hang-if-exists", help="hang (--hang-on) only while this file exists")
    parser.add_argument("--announce", help="a FIFO to write to when hanging")
    parser.add_argument("--ignore-cancel", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--tool-call", action="store_true")
    parser.add_argument("--ask-permission", action="store_true")
    parser.add_argument("--ignore-eof", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--wrapper", action="store_true")
    parser.add_argument("--stop-reason", default="end_turn")
    parser.add_argument("--usage", help="the PromptResponse usage to report, as JSON")
    parser.add_argument("--resume-session", action="store_true")
    parser.add_argument("--close-session", action="store_true")
    parser.add_argument("--steering", action="store_true")
    parser.add_argument("--refuse-steering", action="store_true")
    parser.add_argument("--wait-for-steer", action="store_true")
    parser.add_argument("--think", type=float, help="seconds a prompt takes before answering")
    args = parser.parse_args()
    if args.wrapper:
        wrap([arg for arg in sys.argv[1:] if arg != "--wrapper"], Path(args.state))
    agent = Agent(args)
    pids = [os.getpid()]
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild:
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]).pid)
    with (agent.state / "pids").open("a") as log:
        log.write("".join(f"{pid}\n" for pid in pids))
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("method") == "session/prompt":  # running from the moment it is read
            with _steer_lock:
                _running.add(message["params"]["sessionId"])
        # Requests run in their own threads, so a session/cancel is read while a prompt runs.
        worker = threading.Thread(target=_safely, args=(agent, message), daemon=True)
        worker.start()
    if args.ignore_eof:  # a server that outlives its client: it must be told to go
        threading.Event().wait()


def wrap(argv: list[str], state: Path) -> None:
    """Run the real agent on our stdio, wait for it, exit with its code (never returns)."""
    state.mkdir(parents=True, exist_ok=True)
    with (state / "pids").open("a") as log:
        log.write(f"{os.getpid()}\n")
    real = subprocess.Popen([sys.executable, __file__, *argv])  # same group, same stdio
    sys.exit(real.wait())


def _safely(agent: Agent, message: dict[str, Any]) -> None:
    try:
        agent.handle(message)
    except Exception as exc:
        if "id" in message and "method" in message:
            send({"id": message["id"], "error": {"code": -32603, "message": repr(exc)}})


if __name__ == "__main__":
    main()
