"""How long a client of an HTTP front may take to send a request, and how many it may
keep half-sent at once, so that slow clients cannot lock out the others.

uvicorn times out a connection idle between requests, but not one that trickles its
request's head a byte at a time: 1,100 such connections held every descriptor of a front
(its limit 1,024), and the authorized calls timed out. So each front serves HTTP through
`LimitedH11`:

- A request's head (its line and headers) must arrive within `HEAD_S` of its first byte
  (of the connection, for the first request); past that the connection is closed.
- At most `MAX_HALF_SENT` connections of one client address may be mid-head at once: a
  new one past that closes that client's oldest (a trickler's), so a client that sends
  its request at once is served however many are trickling, even from the same address.
- The body must arrive within ``BODY_S`` of the head (`controlplane.fronts._security`,
  whose guard reads it): past that the request is answered 408.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Final

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEAD_S", "MAX_HALF_SENT", "LimitedH11"]

HEAD_S: Final = 10.0
"""How long a request's head may take to arrive, from its first byte."""
MAX_HALF_SENT: Final = 32
"""How many connections of one client address may be mid-head at once."""


class _HalfSent:
    """The connections mid-head, by client address, oldest first (one per server)."""

    def __init__(self) -> None:
        self.by_client: dict[str, OrderedDict[LimitedH11, None]] = {}

    def add(self, client: str, protocol: LimitedH11) -> None:
        pending = self.by_client.setdefault(client, OrderedDict())
        pending[protocol] = None
        while len(pending) > MAX_HALF_SENT:
            oldest, _ = pending.popitem(last=False)
            oldest.drop("too many half-sent requests from one client")

    def discard(self, client: str, protocol: LimitedH11) -> None:
        pending = self.by_client.get(client)
        if pending is not None:
            pending.pop(protocol, None)
            if not pending:
                del self.by_client[client]


class LimitedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head and a cap on the
    half-sent connections of one client (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        state: Any = self.server_state
        half_sent: _HalfSent | None = getattr(state, "subagent_half_sent", None)
        if half_sent is None:
            half_sent = _HalfSent()
            state.subagent_half_sent = half_sent
        self._half_sent = half_sent
        self._head_timer: asyncio.TimerHandle | None = None
        self._client_key = ""
        self._mid_head = False

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client_key = self.client[0] if self.client else ""
        self._head_begins()

    def data_received(self, data: bytes) -> None:
        if not self._mid_head and (self.cycle is None or self.cycle.response_complete):
            self._head_begins()  # the next request of a kept-alive connection
        before = self.cycle
        super().data_received(data)
        if self._mid_head and self.cycle is not before:
            self._head_done()  # its head arrived whole: the request is the app's now

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def drop(self, why: str) -> None:
        """Close the connection now (a trickler's)."""
        self._mid_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.logger.info("closing a connection from %s: %s", self._client_key, why)
        if not self.transport.is_closing():
            self.transport.close()

    def _head_begins(self) -> None:
        self._mid_head = True
        self._head_timer = self.loop.call_later(HEAD_S, self._head_late)
        self._half_sent.add(self._client_key, self)

    def _head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._mid_head:
            self._mid_head = False
            self._half_sent.discard(self._client_key, self)

    def _head_late(self) -> None:
        self._head_timer = None
        if self._mid_head:
            self._half_sent.discard(self._client_key, self)
            self.drop(f"its request's head did not arrive within {HEAD_S:g}s")
