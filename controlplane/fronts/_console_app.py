"""The console's ASGI app: pages, their event streams, ``/api/`` JSON, actions.

Reads come from the store (`controlplane.fronts._console_views`), on a worker thread; the
pages of one kind share one read per change of the store (`_Views`). Actions go through
the control plane the console opened, as a person (``MessageSource(kind="human")``).

The token, session, CSRF and origin checks and the security headers wrap it
(`controlplane.fronts._console_guard`), inside the fronts' HTTP rules.
"""

from __future__ import annotations

import asyncio
import html
import json
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from controlplane.contract import (
    Budget,
    ErrorCode,
    MessageSource,
    SubagentControlError,
    TextBlock,
)
from controlplane.fronts._console_guard import protect
from controlplane.fronts._console_html import (
    OVERVIEW_BODY,
    RUNTIMES_BODY,
    child_body,
    child_regions,
    overview_regions,
    page,
    runtimes_regions,
)
from controlplane.fronts._console_views import child_page, overview, runtimes_page
from controlplane.fronts._console_watch import ChangeFeed
from controlplane.fronts._security import ASGIApp

if TYPE_CHECKING:
    from controlplane.contract import AgentHandle
    from controlplane.runtime._facade import SubagentControl
    from persistence import SqlStore

__all__ = ["HUMAN_SENDER", "console_app"]

T = TypeVar("T")

HUMAN_SENDER: Final = "console"
"""The ``sender_session_id`` of what a person sends or answers from the console."""
KEEPALIVE_S: Final = 15.0
_MAX_VIEWS: Final = 1000
"""Read locks kept for this many views at most (then those not in use are dropped)."""
_STATUS: Final = {
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.UNAUTHORIZED: 403,
    ErrorCode.CHILD_NOT_FOUND: 404,
    ErrorCode.TASK_NOT_FOUND: 404,
    ErrorCode.REQUEST_NOT_FOUND: 404,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.PERSISTENCE_UNAVAILABLE: 503,
}
_STATIC: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


class _Views:
    """The views of the current store generation, read once however many pages show them:
    the streams a change wakes together wait for the first one's read of their view."""

    def __init__(self, store: SqlStore, feed: ChangeFeed) -> None:
        self._store = store
        self._feed = feed
        self._lock = threading.Lock()
        self._generation = 0
        self._cache: dict[str, dict[str, str]] = {}
        self._reading: dict[str, threading.Lock] = {}

    def changed(self) -> None:
        with self._lock:
            self._generation += 1
            self._cache.clear()

    def regions(self, key: str, read: Callable[[], dict[str, str]]) -> dict[str, str]:
        """The regions of ``key`` (read now, or as read since the last change)."""
        with self._lock:
            found = self._cache.get(key)
            reading = self._reading.setdefault(key, threading.Lock())
        if found is not None:
            return found
        with reading:  # one read per view at a time; the others take its result
            with self._lock:
                found = self._cache.get(key)
                generation = self._generation
            if found is not None:
                return found
            self._feed.view_reads += 1
            found = read()
            with self._lock:
                if generation == self._generation:
                    self._cache[key] = found
                if len(self._reading) > _MAX_VIEWS:  # children's pages come and go
                    self._reading = {k: v for k, v in self._reading.items() if v.locked()}
        return found


def console_app(control: SubagentControl, *, feed: ChangeFeed, token: str | None) -> ASGIApp:
    """The console for ``control``'s store, following ``feed``; ``token`` (or None) is
    asked of every request."""
    store = control.store
    if store is None:
        raise SubagentControlError(
            ErrorCode.PERSISTENCE_UNAVAILABLE, "the console reads a store; open one with a URL"
        )
    views = _Views(store, feed)
    feed.on_change(views.changed)
    secret = secrets.token_bytes(32)
    handlers = _Handlers(control, store, views, feed)
    static = {
        name: (
            resources.files("controlplane.fronts").joinpath("console_static", name).read_bytes(),
            kind,
        )
        for name, kind in _STATIC.items()
    }

    async def serve_static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return Response("not found", status_code=404)
        body, kind = static[name]
        return Response(body, media_type=kind, headers={"cache-control": "no-cache"})

    app = Starlette(
        routes=[
            Route("/", handlers.overview_page),
            Route("/children/{child_id}", handlers.child_page),
            Route("/runtimes", handlers.runtimes_page),
            Route("/events/overview", handlers.overview_events),
            Route("/events/children/{child_id}", handlers.child_events),
            Route("/events/runtimes", handlers.runtimes_events),
            Route("/api/overview", handlers.overview_json),
            Route("/api/children/{child_id}", handlers.child_json),
            Route("/api/runtimes", handlers.runtimes_json),
            Route("/api/requests/{request_id}/answer", handlers.answer, methods=["POST"]),
            Route("/api/tasks/{task_id}/kill", handlers.kill, methods=["POST"]),
            Route("/api/children/{child_id}/messages", handlers.message, methods=["POST"]),
            Route("/api/children/{child_id}/budget", handlers.budget, methods=["POST"]),
            Route("/static/{name}", serve_static),
        ]
    )
    return protect(app, secret=secret, token=token)


class _Handlers:
    def __init__(
        self, control: SubagentControl, store: SqlStore, views: _Views, feed: ChangeFeed
    ) -> None:
        self._control = control
        self._store = store
        self._views = views
        self._feed = feed
        self._parents_lock = threading.Lock()

    # -- pages ---------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        regions = await self._regions("overview", self._overview)
        return _page(request, "Overview", "/events/overview", regions, OVERVIEW_BODY, "/")

    async def child_page(self, request: Request) -> Response:
        child_id = request.path_params["child_id"]
        try:
            regions = await self._regions(f"child:{child_id}", lambda: self._child(child_id))
        except SubagentControlError as exc:
            return _error_page(request, exc)
        stream = f"/events/children/{child_id}"
        return _page(request, "Child", stream, regions, child_body(child_id), "")

    async def runtimes_page(self, request: Request) -> Response:
        regions = await self._regions("runtimes", self._runtimes)
        return _page(request, "Runtimes", "/events/runtimes", regions, RUNTIMES_BODY, "/runtimes")

    # -- streams -----------------------------------------------------------------------

    async def overview_events(self, request: Request) -> Response:
        return self._stream(lambda: self._views.regions("overview", self._overview))

    async def child_events(self, request: Request) -> Response:
        child_id = request.path_params["child_id"]
        return self._stream(
            lambda: self._views.regions(f"child:{child_id}", lambda: self._child(child_id))
        )

    async def runtimes_events(self, request: Request) -> Response:
        return self._stream(lambda: self._views.regions("runtimes", self._runtimes))

    def _stream(self, read: Callable[[], dict[str, str]]) -> Response:
        return StreamingResponse(
            self._follow(read),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def _follow(self, read: Callable[[], dict[str, str]]) -> AsyncIterator[str]:
        """Each region once, then again whenever it changed, until the console stops."""
        woken = self._feed.subscribe()
        sent: dict[str, str] = {}
        try:
            yield "retry: 1000\n\n"
            while not self._feed.stopped:
                woken.clear()
                try:
                    regions = await run_in_threadpool(read)
                except SubagentControlError as exc:
                    yield _sse("problem", {"message": exc.message})
                    regions = sent
                for name, content in regions.items():
                    if sent.get(name) != content:
                        yield _sse("region", {"id": name, "html": content})
                sent = regions
                yield _sse("live", {})
                try:
                    await asyncio.wait_for(woken.wait(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keepalive\n\n"
        finally:
            self._feed.unsubscribe(woken)

    # -- /api/ reads ---------------------------------------------------------------------

    async def overview_json(self, request: Request) -> Response:
        view = await run_in_threadpool(overview, self._store)
        return JSONResponse(view.as_json())

    async def child_json(self, request: Request) -> Response:
        child_id = request.path_params["child_id"]
        try:
            view = await run_in_threadpool(child_page, self._store, child_id)
        except SubagentControlError as exc:
            return _refusal(exc)
        return JSONResponse(view.as_json())

    async def runtimes_json(self, request: Request) -> Response:
        view = await run_in_threadpool(runtimes_page, self._store)
        return JSONResponse(view.as_json())

    # -- actions, as a person --------------------------------------------------------------

    async def answer(self, request: Request) -> Response:
        body = await _body(request)
        allow = body.get("allow")
        if not isinstance(allow, bool):
            return _bad("'allow' must be true or false; nothing was answered")
        note = _optional_text(body.get("note"))
        request_id = request.path_params["request_id"]

        def act() -> dict[str, Any]:
            self._control.answer(HUMAN_SENDER, request_id, allow=allow, note=note, source=_human())
            return {"answered": request_id, "allow": allow}

        return await self._act(act)

    async def kill(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]

        def act() -> dict[str, Any]:
            task = self._store.ledger.get(task_id)
            if task is None:
                raise SubagentControlError(
                    ErrorCode.TASK_NOT_FOUND, f"no task {task_id!r}", task_id=task_id
                )
            self._control.tasks.kill(task_id, requester=task.owner_session)
            return {"killed": task_id}

        return await self._act(act)

    async def message(self, request: Request) -> Response:
        body = await _body(request)
        text = body.get("message")
        if not isinstance(text, str) or not text.strip():
            return _bad("the message is empty; nothing was sent")
        child_id = request.path_params["child_id"]

        def act() -> dict[str, Any]:
            parent = self._parent_of(child_id)
            sent = self._control.send_message(parent, child_id, [TextBlock(text=text)], _human())
            said = (
                "steered the running turn"
                if sent.route == "steered"
                else "started a new turn (the child resumed)"
            )
            return {"route": sent.route, "task_id": sent.task_id, "said": said}

        return await self._act(act)

    async def budget(self, request: Request) -> Response:
        body = await _body(request)
        limits: dict[str, Any] = {}
        for key, field in (("budget-tokens", "tokens"), ("budget-cost", "cost")):
            value = body.get(key, body.get(field))
            if value not in (None, ""):
                try:
                    limits[field] = int(value) if field == "tokens" else float(value)
                except (TypeError, ValueError):
                    return _bad(f"{field} must be a number; the budget is unchanged")
        if not limits:
            return _bad("give tokens or cost; the budget is unchanged")
        child_id = request.path_params["child_id"]

        def act() -> dict[str, Any]:
            budget = Budget(**limits)
            parent = self._parent_of(child_id)
            self._control.set_budget(parent, child_id, budget)
            return {"budget": budget.model_dump(mode="json", exclude_none=True)}

        return await self._act(act)

    async def _act(self, act: Callable[[], dict[str, Any]]) -> Response:
        try:
            result = await run_in_threadpool(act)
        except SubagentControlError as exc:
            return _refusal(exc)
        except ValueError as exc:  # a Budget out of range (pydantic)
            return _bad(f"{exc}; nothing was changed")
        finally:
            self._feed.poke()
        return JSONResponse(result)

    def _parent_of(self, child_id: str) -> AgentHandle:
        """A live handle on the child's parent session in this process (registered on
        first use: the console acts for every session)."""
        session = self._store.spend.parent_of(child_id)
        if session is None:
            raise SubagentControlError(
                ErrorCode.CHILD_NOT_FOUND, f"no child {child_id!r}", child_id=child_id
            )
        with self._parents_lock:
            handle = self._control.agents.get(session)
            if handle is None:
                handle = self._control.agents.register(session)
        return handle

    # -- reads -----------------------------------------------------------------------------

    async def _regions(self, key: str, read: Callable[[], dict[str, str]]) -> dict[str, str]:
        return await run_in_threadpool(self._views.regions, key, read)

    def _overview(self) -> dict[str, str]:
        return overview_regions(overview(self._store))

    def _child(self, child_id: str) -> dict[str, str]:
        return child_regions(child_page(self._store, child_id))

    def _runtimes(self) -> dict[str, str]:
        return runtimes_regions(runtimes_page(self._store))


def _human() -> MessageSource:
    return MessageSource(kind="human", sender_session_id=HUMAN_SENDER)


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _bad(message: str) -> Response:
    return JSONResponse({"error": str(ErrorCode.INVALID_INPUT), "message": message}, 400)


def _refusal(exc: SubagentControlError) -> Response:
    return JSONResponse(
        {"error": str(exc.code), "message": exc.message}, _STATUS.get(exc.code, 409)
    )


def _page(
    request: Request, title: str, stream: str, regions: dict[str, str], body: str, nav: str
) -> Response:
    csrf = request.scope["console.csrf"]
    return HTMLResponse(
        page(title=title, csrf=csrf, stream=stream, regions=regions, body=body, nav=nav)
    )


def _error_page(request: Request, exc: SubagentControlError) -> Response:
    title = "Not found" if exc.code is ErrorCode.CHILD_NOT_FOUND else "Error"
    said = f"<h1>{title}</h1><p>{html.escape(exc.message, quote=True)}</p>"
    shown = page(
        title=title, csrf=request.scope["console.csrf"], stream="", regions={}, body=said, nav=""
    )
    return HTMLResponse(shown, status_code=_STATUS.get(exc.code, 500))
