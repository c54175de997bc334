"""The console's protection around its app, inside the fronts' HTTP rules
(`controlplane.fronts._security.guard`: loopback addressing, the body cap, JSON posts):

- with a token, every request shows it: ``Authorization: Bearer …``, or the cookie set
  when a browser first opens ``/?token=…`` (then redirected to the address without it);
- every request gets a session cookie (``HttpOnly``, ``SameSite=Strict``), and its CSRF
  token (an HMAC of the session under a secret of this process) is handed to the page
  (``scope["console.csrf"]``);
- a POST reaches the app only with an ``Origin`` that is this server's own and that CSRF
  token in ``X-CSRF-Token``; otherwise it is answered 403 and nothing is done;
- every answer carries a Content-Security-Policy without inline script or style.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from http.cookies import SimpleCookie
from typing import Final
from urllib.parse import parse_qs, urlsplit

from controlplane.fronts._security import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "SESSION_COOKIE", "TOKEN_COOKIE", "protect"]

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SESSION_COOKIE: Final = "sc_console_session"
TOKEN_COOKIE: Final = "sc_console_token"


def protect(app: ASGIApp, *, secret: bytes, token: str | None) -> ASGIApp:
    """Token, session cookie, CSRF and origin checks, and the security headers (see the
    module)."""

    def csrf_of(session: str) -> str:
        return hmac.new(secret, session.encode(), hashlib.sha256).hexdigest()[:40]

    async def protected(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {bytes(k).lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
        cookies = _cookies(headers.get(b"cookie", ""))
        set_cookies: list[str] = []
        if token is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            offered = query.get("token", [None])[0]
            if offered is not None and hmac.compare_digest(offered, token):
                set_cookies.append(f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict")
                await _respond(
                    send, 303, b"", "text/plain", set_cookies, location=scope.get("path", "/")
                )
                return
            bearer = headers.get(b"authorization", "")
            shown = cookies.get(TOKEN_COOKIE, "")
            if not (
                hmac.compare_digest(bearer, f"Bearer {token}") or hmac.compare_digest(shown, token)
            ):
                await _respond(
                    send,
                    401,
                    b"this console needs its token: open it once as /?token=TOKEN",
                    "text/plain; charset=utf-8",
                    [],
                )
                return
        session = cookies.get(SESSION_COOKIE, "")
        if len(session) < 20:
            session = secrets.token_urlsafe(24)
            set_cookies.append(f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict")
        if scope.get("method") == "POST":
            refused = _post_refusal(headers, csrf_of(session))
            if refused is not None:
                await _respond(
                    send,
                    403,
                    json.dumps({"error": "forbidden", "message": refused}).encode(),
                    "application/json",
                    [],
                )
                return
        scope["console.csrf"] = csrf_of(session)

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.encode(), v.encode()) for k, v in _SECURITY_HEADERS]
                extra += [(b"set-cookie", c.encode()) for c in set_cookies]
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await app(scope, receive, secured)

    return protected


_SECURITY_HEADERS: Final = (
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
)


def _post_refusal(headers: dict[bytes, str], csrf: str) -> str | None:
    """Why a POST may not change anything, or None: its origin must be this server and it
    must carry the session's CSRF token."""
    origin = headers.get(b"origin")
    host = headers.get(b"host", "")
    if origin is None:
        return "a change needs an Origin header naming this console; nothing was changed"
    try:
        parts = urlsplit(origin)
    except ValueError:
        return "a malformed Origin; nothing was changed"
    if parts.scheme not in ("http", "https") or parts.netloc != host:
        return "a change from another origin is refused; nothing was changed"
    offered = headers.get(b"x-csrf-token", "")
    if not offered or not hmac.compare_digest(offered, csrf):
        return "a missing or wrong CSRF token (reload the page); nothing was changed"
    return None


def _cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed cookie header reads as none (http.cookies.CookieError)
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    kind: str,
    cookies: list[str],
    *,
    location: str | None = None,
) -> None:
    headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in _SECURITY_HEADERS]
    headers += [(b"set-cookie", c.encode()) for c in cookies]
    if location is not None:
        headers.append((b"location", location.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
