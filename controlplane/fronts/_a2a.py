"""The A2A front: the control plane served to A2A clients over HTTP JSON-RPC.

``subagent-control a2a --db URL --http HOST:PORT`` runs `serve_a2a`; `A2AServer` serves one
control plane on one socket, in the caller's thread or a thread of its own. A2A's
``contextId`` is our child id and its ``taskId`` our Task id; requests are answered by
`controlplane.fronts._a2a_handler.ControlPlaneHandler` for one parent session, behind the
fronts' shared HTTP rules (`controlplane.fronts._security`) and opened by their shared
setup (`controlplane.fronts._setup`).

Push notifications are not offered: the SDK's push-config store is an async SQLAlchemy
store of its own (another engine and driver on our database), and only the process that
saw a Task settle could send one; a client that wants the end subscribes or polls.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, TYPE_CHECKING

from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from starlette.applications import Starlette

from controlplane.contract import AgentHandle
from controlplane.fronts._a2a_handler import ControlPlaneHandler
from controlplane.fronts._security import (
    MAX_BODY_BYTES,
    Bind,
    announce_token,
    guard,
    is_loopback,
    listen,
    parse_bind,
    resolve_token,
)
from controlplane.fronts._served import ServedApp
from controlplane.fronts._setup import FrontOptions, default_provider, open_front

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["A2AServer", "agent_card", "serve_a2a"]


def agent_card(url: str, *, bearer: bool) -> AgentCard:
    """The card this server shows at ``/.well-known/agent-card.json``."""
    try:
        ours = version("subagent-control")
    except PackageNotFoundError:  # run from a source tree
        ours = "0"
    card = AgentCard(
        name="subagent-control",
        description=(
            "Continuable background subagents: each context is one durable subagent, each "
            "task one run of it. A message to a working task steers it; to an idle context "
            "it resumes the subagent as a new task."
        ),
        version=ours,
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="start-subagent",
                name="Start a subagent",
                description=(
                    "Send a message without a contextId (or with a new one): it starts a "
                    "subagent in the background. The answer's contextId is the subagent, "
                    "its id the task; the task's label is the message's text."
                ),
                tags=["subagent", "start"],
                examples=["Research the history of the bicycle and summarise it."],
            ),
            AgentSkill(
                id="continue-subagent",
                name="Continue a subagent",
                description=(
                    "Send a message to a subagent's contextId. While its task is working the "
                    "message steers that task (the same task answers); once it is idle the "
                    "subagent resumes from its transcript as a new task. A message naming an "
                    "ended task is refused."
                ),
                tags=["subagent", "steer", "resume"],
                examples=["Also cover the safety bicycle."],
            ),
        ],
    )
    if bearer:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


class A2AServer(ServedApp):
    """One control plane served over A2A on one listening socket, for one parent session.

    The socket is bound and listening when this returns, so `url` is final (port 0 picks
    a free port) and early clients queue until the server runs.

    Args:
        control: The open control plane (the caller closes it, after `stop`).
        parent: The live parent session every client acts as.
        host: Where to listen.
        port: The port (0: any free one).
        provider: The provider new children start on (default: `default_provider`).
        token: The bearer token clients must present (None: none is asked).
        max_body: The cap on a request body, in bytes.
    """

    def __init__(
        self,
        control: SubagentControl,
        parent: AgentHandle,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        provider: str | None = None,
        token: str | None = None,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        handler = ControlPlaneHandler(
            control, parent, provider=provider or default_provider(control)
        )
        bind = Bind(host, port)
        self._socket = listen(bind)
        self.url = f"http://{bind.url_host}:{self._socket.getsockname()[1]}/"
        """Where clients reach it (the card's URL too)."""
        app = Starlette(
            routes=[
                *create_agent_card_routes(agent_card(self.url, bearer=token is not None)),
                # v0.3 clients (``message/send``, …) too: the SDK translates them to the
                # same handler.
                *create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True),
            ]
        )
        guarded = guard(
            app,
            token=token,
            loopback=is_loopback(host),
            max_body=max_body,
            open_paths=frozenset({AGENT_CARD_WELL_KNOWN_PATH}),
        )
        super().__init__(guarded, self._socket, name="a2a-server")


def serve_a2a(
    options: FrontOptions,
    *,
    http: str,
    token: str | None,
    out: IO[str],
    max_body: int = MAX_BODY_BYTES,
    token_dir: Path | None = None,
) -> None:
    """``subagent-control a2a``: open the control plane (`open_front`), print ``ready <url>``
    once the socket listens, serve until a signal, close it.

    Args:
        options: The store, parent session and providers.
        http: ``HOST:PORT`` to listen on.
        token: The bearer token clients must send (else `TOKEN_ENV`, else generated when
            the bind is not loopback).
        out: Where the URL (and a generated token's file) is printed.
        max_body: The cap on a request body, in bytes.
        token_dir: Where a generated token file goes (the temporary directory by default).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a bad bind, token or ``--setup``, or a
            bind it cannot listen on.
    """
    bind = parse_bind(http)  # a typo fails before the store opens
    opened = open_front(options)
    try:
        required, token_file = resolve_token(bind, token, token_dir=token_dir)
        server = A2AServer(
            opened.control,
            opened.parent,
            host=bind.host,
            port=bind.port,
            provider=opened.provider,
            token=required,
            max_body=max_body,
        )
        print(f"ready {server.url}", file=out, flush=True)
        announce_token(bind, token_file, out)
        server.serve()
    finally:
        opened.control.close()
