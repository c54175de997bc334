"""`SubagentControl`: the facade that wires the registries, the store and the actor tree."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import pykka

from actors import (
    ActivationPlan,
    ActorContext,
    Passivator,
    RootActor,
    RootActorProxy,
    RoutingTable,
    SendMessage,
    SpawnChild,
    deliver,
)
from controlplane._admission import Admission, placed_nodes
from controlplane._exit import close_at_exit, closed
from controlplane._forwarding import Forwarder
from controlplane._router import Router
from controlplane._runtime import Heartbeat, Runtime, new_runtime_id
from controlplane._tasks import TaskService
from controlplane._validate import (
    check_child_id,
    check_concurrency,
    check_options,
    check_source,
    check_start_spec,
    message_blocks,
    start_inputs,
    translate,
)
from controlplane.contract import (
    ActorTree,
    AgentHandle,
    AgentRegistry,
    CancelSignal,
    ChildView,
    ContinuableStart,
    ContinuableStartSpec,
    ErrorCode,
    MessageSource,
    ProviderRegistry,
    Requester,
    SendResult,
    SubagentControlError,
    TextBlock,
    Usage,
    requester_session,
    usage_of,
    utcnow,
)
from controlplane.telemetry import Operation, Telemetry
from persistence import SqlStore

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from controlplane._admin import AdminServer

__all__ = ["TASK_TOOLS_SURFACE", "ChildView", "SubagentControl"]

TASK_TOOLS_SURFACE = "task-tools"
DEFAULT_MAX_LIVE_ACTIVATIONS = 2000
"""The default cap on live activations: each holds up to three threads (supervisor,
activation, the provider's loop), and the process's thread ceiling is far above that."""
STORE_OPTIONS = (
    "retry",
    "lock_timeout_s",
    "statement_timeout_s",
    "durable_os_crash",
    "pause_gc_on_load",
)
"""The options `SubagentControl.open` hands to `SqlStore`."""
_ROOT_TIMEOUT_S = 30.0


class SubagentControl:
    """The control plane: start continuable children, steer or resume them, watch their Tasks.

    Example:
        >>> control = SubagentControl.open("sqlite:///state.db")  # doctest: +SKIP

    Args:
        store: Where durable children live; without one, starts and sends are refused
            with ``PERSISTENCE_UNAVAILABLE``.
        task_tools: Attach the built-in task tools as the Task control surface (default).
            Without a surface, starting a background Task is refused.
        close_timeout_s: How long `close` waits for activations to settle.
        passivate_after_s: Retire a child's supervisor (its thread) once the child has been
            idle this long (at least 0.05 s); its next message makes a new one. ``None``
            keeps supervisors until `close`.
        max_live_activations: The most activations that may exist at once (each holds
            threads); the next start or resume is refused with ``CAPACITY``, writing
            nothing. ``None`` for no cap.
        lease_ttl_s: How long this runtime's claims outlive its last heartbeat (renewed
            every third of it): a runtime silent for longer is dead to the others, which
            settle its running Tasks ``interrupted`` (SPEC §9).
        recent_tasks: How many settled Tasks to keep in memory; older ones are read from
            the store.
        tracer_provider: Where the OpenTelemetry spans go (``subagent.start``,
            ``subagent.send``, ``subagent.activation`` and its phases); the global provider
            when None. Needs the ``otel`` extra; without an SDK nothing is recorded.
        meter_provider: Where the OpenTelemetry metrics go; the global provider when None.
        concurrency: Concurrency limits (SPEC §11): ``{key: n}``, key a provider name or
            ``"provider:model"``; at most n activations under that key run at once across
            every runtime on the store (configure the same limits in each). A start or
            resume past it is answered at once and its Task reads ``queued`` until a slot
            frees (FIFO per key: an activation under two limited keys waits its turn under
            each), then ``running``.
    """

    def __init__(
        self,
        store: SqlStore | None = None,
        *,
        task_tools: bool = True,
        close_timeout_s: float = 30.0,
        passivate_after_s: float | None = 300.0,
        max_live_activations: int | None = DEFAULT_MAX_LIVE_ACTIVATIONS,
        lease_ttl_s: float = 10.0,
        recent_tasks: int = 1000,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        concurrency: Mapping[str, int] | None = None,
    ) -> None:
        limits = check_concurrency(concurrency) if concurrency is not None else {}
        check_options(
            close_timeout_s=close_timeout_s,
            passivate_after_s=passivate_after_s,
            max_live_activations=max_live_activations,
            lease_ttl_s=lease_ttl_s,
            recent_tasks=recent_tasks,
        )
        self._store = store
        self._close_timeout_s = close_timeout_s
        self._runtime_id = new_runtime_id()
        self._telemetry = Telemetry(
            self._runtime_id, tracer_provider=tracer_provider, meter_provider=meter_provider
        )
        self.providers = ProviderRegistry()
        self.agents = AgentRegistry()
        self._lock = threading.Lock()
        self._closed = False
        self._admin_servers: list[AdminServer] = []
        self._routes = RoutingTable()
        # Built in one straight line, each object given what it needs: the runtime (its row
        # and judgement, store only), the forwarder and the router on it, the Task service
        # asking the router to claim children and kill Tasks elsewhere, the heartbeat
        # driving the Task service, the actors on the Task service. The router reaches the
        # actors and Task service built after it only through `_route` and `_kill_here`.
        self._runtime: Runtime | None = None
        self._forwarder: Forwarder | None = None
        self._router: Router | None = None
        self._heartbeat: Heartbeat | None = None
        if store is not None:
            store.on_retry(self._telemetry.store_retry)
            self._runtime = Runtime(self._runtime_id, store, lease_ttl_s=lease_ttl_s)
            if store.inbox is not None:
                self._forwarder = Forwarder(self._runtime, store)
            self._router = Router(
                self._runtime, self._forwarder, self.agents,
                deliver_here=self._route, kill_here=self._kill_here,
            )  # fmt: skip
        self.tasks = TaskService(
            max_live=max_live_activations,
            ledger=store.ledger if store is not None else None,
            runtime_id=self._runtime_id,
            recent=recent_tasks,
            telemetry=self._telemetry,
            routing=self._router,
            interrupter=self._runtime.interrupt_fenced if self._runtime is not None else None,
            queue=store.queue if store is not None else None,
        )
        self._admission: Admission | None = None
        if store is not None and self._runtime is not None and limits:
            self._admission = Admission(limits, store, self._runtime, self.tasks, self.agents)
        if task_tools:
            self.tasks.attach_surface(TASK_TOOLS_SURFACE)
        self.agents.on_dispose(self._kill_tasks_of)
        self._root: RootActorProxy | None = None
        self._passivator: Passivator | None = None
        if store is not None and self._runtime is not None and self._router is not None:
            adopts = self._admission is not None
            self._heartbeat = Heartbeat(self._runtime, store, self.tasks, adopts=adopts)
            context = ActorContext(
                store, self.tasks, self.agents, self.providers, runtime_id=self._runtime_id,
                admission=self._admission,
            )  # fmt: skip
            self._root = RootActorProxy(RootActor.start(context, self._routes))
            if passivate_after_s is not None:
                self._passivator = Passivator(self._root.ref, passivate_after_s)
            self._heartbeat.start()  # recovers what a crash left before the first send
            self._router.start()  # serves other runtimes' messages, now that the actors exist
            if self._admission is not None:  # decides and adopts, now that the actors exist
                self._admission.start(self._spawn_adopted)
        close_at_exit(self, self._close_at_exit)  # a script that never calls close() exits

    @classmethod
    def open(cls, url: str, **options: Any) -> SubagentControl:
        """Build the store from ``url`` (``sqlite:///…`` or ``postgresql+psycopg://…``) and
        pass every option (``task_tools=``, …) to the constructor; the store's own options
        (`STORE_OPTIONS`: ``retry``, ``lock_timeout_s``, ``statement_timeout_s``,
        ``durable_os_crash``, ``pause_gc_on_load``) go to `SqlStore`."""
        if options.get("concurrency") is not None:  # refused before the store is made
            check_concurrency(options["concurrency"])
        store_options = {name: options.pop(name) for name in STORE_OPTIONS if name in options}
        store = SqlStore(url, **store_options)
        try:
            return cls(store, **options)
        except BaseException:
            store.close()
            raise

    # -- properties ------------------------------------------------------------------

    @property
    def store(self) -> SqlStore | None:
        """The durable store (``None`` when the control plane was built without one)."""
        return self._store

    @property
    def runtime_id(self) -> str:
        """This runtime's id: unique across processes, machines and restarts."""
        return self._runtime_id

    @property
    def telemetry(self) -> Telemetry:
        """This control plane's spans, metrics and lifecycle logs (README, "Observe it")."""
        return self._telemetry

    @property
    def closed(self) -> bool:
        """Whether `close` has been called."""
        return self._closed

    # -- starting --------------------------------------------------------------------

    def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableStart:
        """Start a durable child in the background and return its ids at once.

        The child becomes durable when its run is published; a start that fails before
        that leaves no resumable child, and its Task settles ``failed`` (or ``killed``).

        Raises:
            SubagentControlError: ``CLOSED``, ``UNKNOWN_PROVIDER``,
                ``PERSISTENCE_UNAVAILABLE``, ``INVALID_DESCRIPTOR``, ``NO_CONTROL_SURFACE``,
                ``UNAUTHORIZED`` (checked in that order); nothing is left behind.
        """
        with self._telemetry.start() as op:
            return op.started(self._start(spec, op))

    def _start(self, spec: ContinuableStartSpec, op: Operation) -> ContinuableStart:
        self._check_open()
        spec = check_start_spec(spec)
        self.providers.get(spec.provider)
        root = self._require_store()
        parent = spec.parent
        descriptor, seed, prompt = start_inputs(spec)
        op.message(prompt)
        self.tasks.require_surface()
        self._check_parent(parent)
        child_id = str(uuid.uuid4())
        signal = CancelSignal()
        task = self.tasks.start(label=spec.label, owner=parent, child_id=child_id, signal=signal)
        trace = op.admit(task_id=task.id, child_id=child_id, route="initial", descriptor=descriptor)
        plan = ActivationPlan(
            kind="initial",
            task_id=task.id,
            child_id=child_id,
            parent=parent,
            prompt=prompt,
            source=MessageSource(kind="user"),
            signal=signal,
            label=spec.label,
            descriptor=descriptor,
            depth=parent.depth + 1,
            seed=seed,
            created_at=task.created_at,
            trace=trace,
        )
        try:
            if self._admission is not None:  # queued in call order (its model is known)
                self._admission.enter_start(plan)
            root.spawn_child(SpawnChild(plan=plan))
        except BaseException as exc:
            self.tasks.discard(task.id)
            if self._admission is not None:
                self._admission.release(task.id)
            trace.end(None)
            raise translate(exc, "nothing was started") from exc
        return ContinuableStart(child_id=child_id, task_id=task.id)

    # -- messaging -------------------------------------------------------------------

    def send_message(
        self,
        parent: AgentHandle,
        child_id: str,
        message: Sequence[TextBlock],
        source: MessageSource | None = None,
    ) -> SendResult:
        """Deliver a follow-up: steer the running activation, or resume the idle child.

        Returns ``steered`` (with the running Task's id) only once the message is in the
        child's transcript, or ``started`` (with a new Task's id) at once.

        Raises:
            SubagentControlError: the message was not delivered (``NOT_DELIVERED``,
                ``TASK_NOT_FOUND``, ``OWNERSHIP_CONFLICT``, ``UNAUTHORIZED``,
                ``INVALID_INPUT``, ``CLOSED``, ``PERSISTENCE_UNAVAILABLE``), except
                ``DURABILITY_FAILED``: the running turn has it, the transcript may not
                (forwarded to another runtime while the store failed past its bound:
                the turn may have it; look in the transcript before sending it again).
        """
        telemetry = self._telemetry
        if telemetry.quiet():  # nothing to record: no span, metric or log line
            return self._send(parent, child_id, message, source, None)
        with telemetry.send(child_id) as op:
            return op.sent(self._send(parent, child_id, message, source, op))

    def _send(
        self,
        parent: AgentHandle,
        child_id: str,
        message: Sequence[TextBlock],
        source: MessageSource | None,
        op: Operation | None,
    ) -> SendResult:
        self._check_open()
        router = self._require_router()
        self._check_parent(parent)
        check_child_id(child_id)
        blocks = message_blocks(message)
        source = check_source(
            source or MessageSource(kind="coordinator", sender_session_id=parent.session_id)
        )
        send = SendMessage(
            parent=parent,
            message=blocks,
            source=source,
            origin=op.message(blocks, source) if op is not None else None,
        )
        return router.send(child_id, send)

    def _route(self, child_id: str, send: SendMessage) -> SendResult:
        """Hand ``send`` to the child's supervisor here and return what it did."""
        root = self._require_store()
        return deliver(self._routes, root, child_id, send, check_open=self._check_open)

    # -- inspection ------------------------------------------------------------------

    def children(self, parent: AgentHandle | str) -> list[ChildView]:
        """Every child of ``parent``: durable ones from the store, plus those still starting.

        Oldest first; ``running`` when the child's newest Task in this process is running.
        """
        session = parent.session_id if isinstance(parent, AgentHandle) else parent
        # The Tasks first, then the store: a child is durable from its publication on, and
        # its initial Task runs until then, so it is always in one of the two snapshots.
        # (A running Task whose child the store does not have yet is a start on its way.)
        latest_tasks = self.tasks.latest_by_child(session)
        found = {
            child_id: (task.label, task.created_at)
            for child_id, task in latest_tasks.items()
            if not task.status.is_terminal  # running, or queued for a slot
        }
        if self._store is not None:
            for meta in self._store.list_children(session):
                found[meta.child_id] = (meta.label or "", meta.created_at)
        views = []
        for child_id, (label, created) in found.items():
            latest = latest_tasks.get(child_id)
            views.append(
                ChildView(
                    child_id=child_id,
                    label=label,
                    running=latest is not None and not latest.status.is_terminal,
                    task_id=latest.id if latest else None,
                    created_at=created,
                )
            )
        return sorted(views, key=lambda view: view.created_at)

    def dump_tree(self, *, timeout_s: float = 0.25) -> ActorTree:
        """The actor tree right now; a supervisor busier than ``timeout_s`` shows as busy."""
        nodes = []
        if self._root is not None and not self._closed:
            try:
                nodes = self._root.describe_all(timeout_s)
            except (pykka.ActorDeadError, pykka.Timeout):
                nodes = []
        nodes = placed_nodes(nodes, self.tasks)
        forwarded = self._router.in_flight() if self._router is not None else []
        return ActorTree(
            taken_at=utcnow(), closed=self._closed, supervisors=nodes,
            runtime_id=self._runtime_id, forwarded=forwarded,
        )  # fmt: skip

    def serve_admin(self, path: str | os.PathLike[str]) -> AdminServer:
        """Serve the read-only admin socket (mode 0600) at ``path`` until `close`."""
        from controlplane._admin import AdminServer

        self._check_open()
        server = AdminServer(path, dump=self.dump_tree).start()
        with self._lock:
            self._admin_servers.append(server)
        return server

    # -- lifecycle -------------------------------------------------------------------

    def close(self, *, timeout_s: float | None = None) -> None:
        """Cancel every activation, wait for their settlement, then stop actors and store.

        Idempotent. Activations that do not settle within the timeout are abandoned (their
        daemon threads cannot keep the process alive). A control plane still open when the
        interpreter exits is closed then, within a bound (`controlplane._exit`).
        """
        self._close(self._close_timeout_s if timeout_s is None else timeout_s, abandon=True)

    def _close_at_exit(self, timeout_s: float) -> None:
        """`close` at interpreter exit. Past the deadline, a Task whose activation has not
        settled is left running in the store, as a crash leaves it (the next runtime settles
        it ``interrupted`` and closes its turn), not settled ``killed`` over an open turn:
        after the exit nobody here can read it, and the store must stay consistent."""
        self._close(timeout_s, abandon=False)

    def _close(self, budget: float, *, abandon: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            servers, self._admin_servers = self._admin_servers, []
        closed(self)
        deadline = time.monotonic() + budget
        for server in servers:
            server.close()
        if self._router is not None:
            self._router.stop_serving()
        if self._passivator is not None:
            self._passivator.stop()
        if self._root is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._root.stop_accepting(_ROOT_TIMEOUT_S)
        for task_id in self.tasks.close("control plane closed"):
            self.tasks.wait_released(task_id, max(0.0, deadline - time.monotonic()))
        if abandon:
            # Past the deadline: what has not settled is killed here, so no Task reads
            # `running` after close (its daemon thread may still end later; it writes nothing).
            self.tasks.abandon("killed: the control plane closed before the run stopped")
        if self._admission is not None:
            self._admission.close()
        if self._root is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._root.shutdown(max(1.0, deadline - time.monotonic()))
        if self._router is not None:
            self._router.close()
        if self._heartbeat is not None:
            self._heartbeat.close()
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SubagentControlError(
                ErrorCode.CLOSED, "the control plane is closed; open a new one to continue"
            )

    def _require_store(self) -> RootActorProxy:
        if self._root is None:
            raise SubagentControlError(
                ErrorCode.PERSISTENCE_UNAVAILABLE,
                "no store is configured, so children could not be made durable; "
                "build the control plane with a store (SubagentControl.open(url))",
            )
        return self._root

    def _require_router(self) -> Router:
        self._require_store()
        assert self._router is not None  # built with the store, as the root is
        return self._router

    def _check_parent(self, parent: object) -> None:
        if not isinstance(parent, AgentHandle):
            raise SubagentControlError(
                ErrorCode.UNAUTHORIZED, "the parent must be a live AgentHandle from agents.register"
            )
        if not parent.is_live or self.agents.get(parent.session_id) is not parent:
            raise SubagentControlError(
                ErrorCode.UNAUTHORIZED,
                f"parent session {parent.session_id!r} is not live in this control plane",
            )

    def _spawn_adopted(self, plan: ActivationPlan) -> None:
        """Start a queued Task adopted from a dead runtime (`Admission`)."""
        self._require_store().spawn_child(SpawnChild(plan=plan))

    def _kill_here(self, task_id: str, reason: str) -> bool:
        """Abort a Task of this runtime whose kill another runtime forwarded (the router's
        ``kill_here``: the Task service is built after the router)."""
        return self.tasks.kill_here(task_id, reason)

    def _kill_tasks_of(self, agent: AgentHandle) -> None:
        self.tasks.kill_owned_by(agent.session_id, f"owner session {agent.session_id} disposed")

    # -- spend -----------------------------------------------------------------------

    def usage(self, requester: Requester, child_id: str) -> Usage:
        """What ``child_id`` has spent over all its turns, read from the store (SPEC §11).

        The sum of the usage recorded with its own events (a fork's seed is its parent's
        spend), so it holds across resumes, runtimes and restarts; a turn still running
        counts what it has written so far.

        Args:
            requester: The child's parent session (its live handle or its session id).
            child_id: The child.

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND`` for an unknown child or one that is
                not the requester's (the same error: whether it exists is not told);
                ``INVALID_INPUT`` for a requester that is neither a handle nor a session
                id; ``PERSISTENCE_UNAVAILABLE``, ``STORE_UNAVAILABLE``, ``CLOSED``.
        """
        self._check_open()
        self._require_store()
        assert self._store is not None
        session = requester_session(requester)
        unknown = SubagentControlError(
            ErrorCode.CHILD_NOT_FOUND,
            f"no child {child_id!r} for this session; list your children and use one of those ids",
            child_id=child_id if isinstance(child_id, str) else None,
        )
        try:
            loaded = self._store.load(child_id)
        except SubagentControlError as exc:
            # An id the store cannot even hold is as unknown as one it does not have.
            if exc.code in (ErrorCode.CHILD_NOT_FOUND, ErrorCode.INVALID_INPUT):
                raise unknown from None
            raise
        if loaded.meta.parent_session != session:
            raise unknown
        return usage_of(loaded.own_events)
