"""A Chat Completions server on 127.0.0.1, for tests and benchmarks: real sockets, real HTTP.

It serves scripted steps in order (a reply, a tool call, an HTTP error, or a stream that
stops mid-way until the client goes), records every request body, and streams the way real
servers do: server-sent events, text in small pieces, a tool call's arguments split across
chunks. Past the script it echoes the last user message.

Run on its own (``python tests/providers/openai_server.py``) it prints its base URL and
serves until interrupted: the stand-in the examples' tests use.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ChatServer", "Step"]

Step = dict[str, Any]
"""``{"text", "tool_calls", "finish"}`` for a reply; ``{"status", "message", "headers"}``
for an error; ``{"hang": True, "text"}`` to stream the text, then wait for the client to
go; ``"stall": True`` in any step holds the answer until `ChatServer.answer` is set;
``"pause": n`` in a streamed step streams ``n`` chunks, then holds the rest the same way;
``"usage": {...}`` (Chat Completions ``usage``: ``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details``, …) is sent with a reply, and with a stream only when the request
asks for it (``stream_options.include_usage``), in a last chunk with no choices, the
others carrying ``"usage": null``, as OpenAI does."""


class ChatServer:
    """The server; use as a context manager, or `start` / `close`."""

    def __init__(self, steps: Sequence[Step] = ()) -> None:
        self._lock = threading.Condition()
        self._steps = list(steps)
        self._served = 0
        self.requests: list[dict[str, Any]] = []
        self.disconnected = threading.Event()  # a hung stream saw its client go
        self.hanging = threading.Event()  # a hung stream is waiting for its client
        self.stalled = threading.Event()  # a stalled request is waiting for `answer`
        self.paused = threading.Event()  # a paused stream is waiting for `answer`
        self.answer = threading.Event()  # lets stalled requests answer
        self._http = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(0.05,), name="chat-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *steps: Step) -> None:
        """Append steps to serve."""
        with self._lock:
            self._steps.extend(steps)

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def wait_requests(self, n: int, timeout_s: float = 5.0) -> bool:
        """Block until ``n`` requests have come in; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self.requests) >= n, timeout_s)

    def next_step(self, body: dict[str, Any]) -> Step:
        with self._lock:
            self.requests.append(body)
            self._lock.notify_all()
            index, self._served = self._served, self._served + 1
            if index < len(self._steps):
                return self._steps[index]
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        return {"text": f"echo: {users[-1]['content'] if users else ''}"}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (a kill, a closed pool) is part of the tests


def _handler(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_ChatHandler):
        chat = server

    return Handler


class _ChatHandler(BaseHTTPRequestHandler):
    chat: ChatServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each small write waits for a delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        step = self.chat.next_step(body)
        if step.get("stall"):
            self.chat.stalled.set()
            self.chat.answer.wait(30.0)
        if "status" in step:
            error = {"error": {"message": step.get("message", "error"), "type": "test"}}
            self._send(int(step["status"]), json.dumps(error).encode(), step.get("headers", {}))
        elif body.get("stream"):
            self._stream(body, step)
        else:
            self._send(200, json.dumps(_completion(body, step)).encode(), {})

    def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, body: dict[str, Any], step: Step) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for n, chunk in enumerate(_chunks(body, step)):
                if n == step.get("pause"):
                    self.chat.paused.set()
                    self.chat.answer.wait(30.0)
                self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            if step.get("hang"):
                self.chat.hanging.set()
                # Blocks until the client closes or shuts its socket (then reads b"").
                self.connection.recv(1)
                self.chat.disconnected.set()
                self.close_connection = True
                return
            done = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        except OSError:
            self.chat.disconnected.set()
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _completion(body: dict[str, Any], step: Step) -> dict[str, Any]:
    calls = step.get("tool_calls", [])
    message: dict[str, Any] = {"role": "assistant", "content": step.get("text", "")}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": _function(c)} for c in calls
        ]
    finish = step.get("finish", "tool_calls" if calls else "stop")
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "test"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        **({"usage": step["usage"]} if "usage" in step else {}),
    }


def _chunks(body: dict[str, Any], step: Step) -> Iterator[dict[str, Any]]:
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body.get("model", "test"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **({"usage": None} if with_usage else {}),
        }

    yield chunk({"role": "assistant", "content": ""})
    text = step.get("text", "")
    for at in range(0, len(text), 3):
        yield chunk({"content": text[at : at + 3]})
    calls = step.get("tool_calls", [])
    for index, call in enumerate(calls):
        arguments = _function(call)["arguments"]
        half = len(arguments) // 2
        head = {"index": index, "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": call["name"], "arguments": ""}}]})
        for piece in (arguments[:half], arguments[half:]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if not step.get("hang"):
        yield chunk({}, step.get("finish", "tool_calls" if calls else "stop"))
        if with_usage and "usage" in step:
            yield {**chunk({}), "choices": [], "usage": step["usage"]}


def _function(call: dict[str, Any]) -> dict[str, str]:
    arguments = call.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"name": call["name"], "arguments": text}


if __name__ == "__main__":
    with ChatServer() as served:
        print(served.base_url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            sys.exit(0)
