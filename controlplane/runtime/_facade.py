"""`SubagentControl`: the facade that wires the registries, the store and the actor tree.

Its spend and limits (prices, budgets, usage, concurrency) are
`controlplane.runtime.spend._spend_api`, a mixin it inherits, and the options that configure them
are checked there; how it closes is `controlplane.runtime._closing`, another."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    SubagentControlError,
    seconds_problem,
)
from controlplane.runtime._closing import ClosingApi
from controlplane.runtime._defaults import (
    DEFAULT_MAX_RECOVERIES,
    DEFAULT_MAX_TOOL_ROUNDS,
    DEFAULT_NOTICE_AT,
    PROVIDER_WAIT_S,
)
from controlplane.runtime._exit import close_at_exit
from controlplane.runtime._handle import HandleApi
from controlplane.runtime._validate import (
    check_child_id,
    check_option,
    check_options,
    check_recovery,
    check_source,
    check_start_spec,
    message_blocks,
    start_inputs,
    translate,
)
from controlplane.runtime.approvals._approval_api import (
    DEFAULT_APPROVAL_GRACE_S,
    ApprovalApi,
    check_grace,
)
from controlplane.runtime.spend._spend_api import SpendApi, SpendOptions

# What this module imports when it loads is what `from controlplane import SubagentControl`
# pays: the classes the facade wires (the wings, the actor system) and the contract's pydantic
# models are imported where a control plane is built or used, not here
# (tests/test_import_cost.py).
if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from actors import ActivationPlan, Passivator, RootActorProxy, SendMessage
    from controlplane.contract import (
        ActorTree,
        AgentHandle,
        Budget,
        ChildView,
        ContinuableStart,
        ContinuableStartSpec,
        MessageSource,
        Price,
        Prices,
        SendResult,
        TaskSnapshot,
    )
    from controlplane.runtime._admin import AdminServer
    from controlplane.runtime._handle import Message
    from controlplane.runtime.approvals._approvals import Approvals
    from controlplane.runtime.lease._recovery import Recovery
    from controlplane.runtime.lease._runtime import Heartbeat, Runtime
    from controlplane.runtime.routing._forwarding import Forwarder
    from controlplane.runtime.routing._router import Router
    from controlplane.runtime.spend._admission import Admission
    from controlplane.runtime.spend._budgets import Budgets
    from controlplane.telemetry import Operation, Telemetry
    from persistence import SqlStore

__all__ = ["TASK_TOOLS_SURFACE", "SubagentControl"]

TASK_TOOLS_SURFACE = "task-tools"
DEFAULT_MAX_LIVE_ACTIVATIONS = 2000
"""The default cap on live activations: each holds up to three threads (the activation's,
the provider's loop, its supervisor's while it handles a message), and the process's
thread ceiling is far above that."""
STORE_OPTIONS = (
    "retry",
    "lock_timeout_s",
    "statement_timeout_s",
    "durable_os_crash",
    "pause_gc_on_load",
)
"""The options `SubagentControl.open` hands to `SqlStore`."""


class SubagentControl(HandleApi, SpendApi, ApprovalApi, ClosingApi):
    """The control plane: start continuable children, steer or resume them, watch their Tasks.

    Example:
        >>> control = SubagentControl.open("sqlite:///state.db")  # doctest: +SKIP

    Args:
        store: Where durable children live; without one, starts and sends are refused
            with ``PERSISTENCE_UNAVAILABLE``.
        task_tools: Attach the built-in task tools as the Task control surface (default).
            Without a surface, starting a background Task is refused.
        close_timeout_s: How long `close` lets running turns go on before it hands them
            over: it stops taking work at once, waits at most this long for its running
            activations to settle by themselves, then stops the rest, handing their turns
            over (or killing them, with ``recover=False``). Default 0: handed over at once.
        passivate_after_s: Retire a child's supervisor (a few KiB of objects; it holds no
            thread while idle) once the child has been idle this long (at least 0.05 s);
            its next message makes a new one. ``None`` keeps supervisors until `close`.
        max_live_activations: The most activations that may exist at once (each holds
            threads); the next start or resume is refused with ``CAPACITY``, writing
            nothing. ``None`` for no cap.
        lease_ttl_s: How long this runtime's claims outlive its last heartbeat (renewed
            every twentieth of it): a runtime silent for longer is dead to the others, which
            settle its running Tasks ``interrupted``.
        recent_tasks: How many settled Tasks to keep in memory; older ones are read from
            the store.
        tracer_provider: Where the OpenTelemetry spans go (``subagent.start``,
            ``subagent.send``, ``subagent.activation`` and its phases); the global provider
            when None. Needs the ``otel`` extra; without an SDK nothing is recorded.
        meter_provider: Where the OpenTelemetry metrics go; the global provider when None.
        prices: What the children's models cost, USD per million tokens: a `Price` (or a
            mapping of its fields) per ``"provider:model"`` or ``"model"``. A model call's
            cost is computed from it when its usage is recorded, and stored with it;
            without a price its cost stays unknown (None).
        session_budget: A `Budget` for everything one parent session's children and their
            descendants spend together (README, "Budgets and limits").
        tree_budget: The `Budget` of a top-level child started without one (it holds for
            the child with everything it starts).
        budget_notice_at: The soft threshold: the parent gets one notice when a budget's
            spend first passes this fraction of a limit; None for no notice.
        max_tool_rounds: The most tool rounds (replies with tool calls) a turn may run;
            past it the turn ends ``budget_exhausted``. None for no cap.
        concurrency: Concurrency limits: ``{key: n}``, key a provider name or
            ``"provider:model"``; at most n activations under that key run at once across
            every runtime on the store (configure the same limits in each). A start or
            resume past it is answered at once and its Task reads ``queued`` until a slot
            frees (FIFO per key: an activation under two limited keys waits its turn under
            each), then ``running``.
        approval_grace_s: How long a child's run waits for an approval answer holding its
            thread before it parks: the run ends, its Task stays
            ``input_required``, and the answer continues it from the store, in any runtime.
        recover: Carry on the running Tasks of runtimes that ended (crashed, lost their
            lease, or closed) in this runtime, same Task, same turn,
            when it has the child's provider. False: settle them ``interrupted`` instead.
        max_recoveries: How many times one Task's turn is recovered before the next end
            of its runtime settles it ``interrupted`` (default
            `controlplane.runtime._defaults.DEFAULT_MAX_RECOVERIES`).
        provider_wait_s: How long a dead runtime's running Task whose provider this
            runtime lacks is left running for a runtime that has it, counted from the dead
            runtime's end; then this runtime settles it ``interrupted``, naming the
            provider it waited for.
    """

    def __init__(
        self,
        store: SqlStore | None = None,
        *,
        task_tools: bool = True,
        close_timeout_s: float = 0.0,
        passivate_after_s: float | None = 300.0,
        max_live_activations: int | None = DEFAULT_MAX_LIVE_ACTIVATIONS,
        lease_ttl_s: float = 10.0,
        recent_tasks: int = 1000,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        prices: Prices | Mapping[str, Price | Mapping[str, Any]] | None = None,
        session_budget: Budget | None = None,
        tree_budget: Budget | None = None,
        budget_notice_at: float | None = DEFAULT_NOTICE_AT,
        max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS,
        concurrency: Mapping[str, int] | None = None,
        approval_grace_s: float = DEFAULT_APPROVAL_GRACE_S,
        recover: bool = True,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        provider_wait_s: float = PROVIDER_WAIT_S,
    ) -> None:
        from actors import ActorContext, Passivator, RootActor, RootActorProxy, RoutingTable
        from controlplane.contract import AgentRegistry, ProviderRegistry
        from controlplane.runtime._task_view import Tasks
        from controlplane.runtime.approvals._approvals import Approvals
        from controlplane.runtime.lease._recovery import Recovery
        from controlplane.runtime.lease._runtime import Heartbeat, Runtime, new_runtime_id
        from controlplane.runtime.routing._forwarding import Forwarder
        from controlplane.runtime.routing._router import Router
        from controlplane.runtime.tasks._tasks import TaskService
        from controlplane.telemetry import Telemetry

        # First: a bad price, budget or limit is refused before anything is built.
        spend = SpendOptions.checked(
            prices=prices,
            session_budget=session_budget,
            tree_budget=tree_budget,
            budget_notice_at=budget_notice_at,
            max_tool_rounds=max_tool_rounds,
            concurrency=concurrency,
        )
        check_options(
            close_timeout_s=close_timeout_s,
            passivate_after_s=passivate_after_s,
            max_live_activations=max_live_activations,
            lease_ttl_s=lease_ttl_s,
            recent_tasks=recent_tasks,
        )
        grace_s = check_grace(approval_grace_s)
        check_recovery(recover, max_recoveries)
        check_option("provider_wait_s", seconds_problem(provider_wait_s))
        self._store = store
        self._prices = spend.prices
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
        self._budgets: Budgets | None = None
        if store is not None:
            self._budgets = spend.budgets(store)
            store.on_retry(self._telemetry.store_retry)
            self._runtime = Runtime(self._runtime_id, store, lease_ttl_s=lease_ttl_s)
            if store.inbox is not None:
                self._forwarder = Forwarder(self._runtime, store, self._telemetry)
            self._router = Router(
                self._runtime, self._forwarder, self.agents,
                deliver_here=self._route, kill_here=self._kill_here,
            )  # fmt: skip
        # The full Task service stays here (the runtime, the actors and the fronts write
        # through it); callers hold `tasks`, a view with the documented verbs only.
        self._tasks = TaskService(
            max_live=max_live_activations,
            ledger=store.ledger if store is not None else None,
            runtime_id=self._runtime_id,
            recent=recent_tasks,
            telemetry=self._telemetry,
            routing=self._router,
            interrupter=self._runtime.interrupt_fenced if self._runtime is not None else None,
            queue=store.queue if store is not None else None,
        )
        self.tasks = Tasks(self._tasks)
        self._admission: Admission | None = None
        if store is not None and self._runtime is not None:
            self._admission = spend.admission(store, self._runtime, self._tasks, self.agents)
        if task_tools:
            self._tasks.attach_surface(TASK_TOOLS_SURFACE)
        if self._budgets is not None:
            self._tasks.add_notices(self._budgets.drain)
        self._approvals: Approvals | None = None
        if store is not None and self._runtime is not None:
            self._approvals = Approvals(
                store, self._runtime, self._tasks, self.providers, grace_s=grace_s
            )
            self._tasks.add_notices(self._approvals.notices)
            self._tasks.add_approvals(self._approvals.requests, self._approvals.kill_parked)
        self._recovery: Recovery | None = None
        if store is not None and self._runtime is not None:
            self._recovery = Recovery(
                store, self._runtime, self.providers,
                enabled=recover, max_recoveries=max_recoveries,
                provider_wait_s=provider_wait_s,
            )  # fmt: skip
            self._runtime.recovery = self._recovery
        self.agents.on_dispose(self._kill_tasks_of)
        self._root: RootActorProxy | None = None
        self._passivator: Passivator | None = None
        if store is not None and self._runtime is not None and self._router is not None:
            adopts = self._admission is not None
            self._heartbeat = Heartbeat(self._runtime, store, self._tasks, adopts=adopts)
            context = ActorContext(
                store, self._tasks, self.agents, self.providers, self._telemetry,
                runtime_id=self._runtime_id,
                prices=self._prices,
                budgets=self._budgets,
                admission=self._admission,
                approvals=self._approvals,
                hands_over=recover,
            )  # fmt: skip
            self._root = RootActorProxy(RootActor.start(context, self._routes))
            if passivate_after_s is not None:
                self._passivator = Passivator(self._root.ref, passivate_after_s)
            if self._recovery is not None:  # carries dead runtimes' Tasks on, from the sweep
                self._recovery.start(
                    self._recover_here, wake=self._sweep_soon, runs_here=self._tasks.runs_here
                )
            self._heartbeat.start()  # recovers what a crash left before the first send
            # Providers are registered after `open`: each one may let this runtime carry
            # on Tasks the first sweep had to leave.
            self.providers.on_register(lambda _name: self._sweep_soon())
            self._router.start()  # serves other runtimes' messages, now that the actors exist
            if self._admission is not None:  # decides and adopts, now that the actors exist
                self._admission.start(self._spawn_adopted)
            if self._approvals is not None:  # continues answered Tasks, now that they exist
                self._approvals.start(self._continue_parked)
        close_at_exit(self, self._close_at_exit)  # a script that never calls close() exits

    @classmethod
    def open(cls, url: str, **options: Any) -> SubagentControl:
        """Build the store from ``url`` (``sqlite:///…`` or ``postgresql+psycopg://…``) and
        pass every option (``task_tools=``, …) to the constructor; the store's own options
        (`STORE_OPTIONS`: ``retry``, ``lock_timeout_s``, ``statement_timeout_s``,
        ``durable_os_crash``, ``pause_gc_on_load``) go to `SqlStore`."""
        from persistence import SqlStore  # the store's modules load with the first store

        store_options = {name: options.pop(name) for name in STORE_OPTIONS if name in options}
        SpendOptions.precheck(options)  # refused before the store is made: nothing to undo
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
        descriptor, seed, prompt = start_inputs(spec, default_budget=self._start_budget(parent))
        self._require_priced(descriptor)
        op.message(prompt)
        self._tasks.require_surface()
        self._check_parent(parent)
        child_id = str(uuid.uuid4())
        signal = CancelSignal()
        task = self._tasks.start(label=spec.label, owner=parent, child_id=child_id, signal=signal)
        trace = op.admit(task_id=task.id, child_id=child_id, route="initial", descriptor=descriptor)
        from actors import ActivationPlan, SpawnChild
        from controlplane.contract import ContinuableStart, MessageSource

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
            self._tasks.discard(task.id)
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
        message: Message,
        source: MessageSource | None = None,
    ) -> SendResult:
        """Deliver a follow-up: steer the running activation, or resume the idle child.

        Returns ``steered`` (with the running Task's id) only once the message is in the
        child's transcript, or ``started`` (with a new Task's id) at once.

        Raises:
            SubagentControlError: the message was not delivered (``NOT_DELIVERED``,
                ``TASK_NOT_FOUND``, ``OWNERSHIP_CONFLICT``, ``UNAUTHORIZED``,
                ``INVALID_INPUT``, ``CLOSED``, ``PERSISTENCE_UNAVAILABLE``;
                ``BUDGET_EXHAUSTED`` for an idle child with a limit of its budget, an
                ancestor's or its session's reached: raise it with `set_budget`), except
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
        message: Message,
        source: MessageSource | None,
        op: Operation | None,
    ) -> SendResult:
        router, send = self._send_of(parent, child_id, message, source, op)
        return router.send(child_id, send)

    def _send_of(
        self,
        parent: AgentHandle,
        child_id: str,
        message: Message,
        source: MessageSource | None,
        op: Operation | None,
    ) -> tuple[Router, SendMessage]:
        """A send's checks (no I/O: an event loop runs them too, `controlplane.runtime._asend`)
        and the router and message it goes through."""
        wired = _wiring()
        self._check_open()
        router = self._require_router()
        self._check_parent(parent)
        check_child_id(child_id)
        blocks = message_blocks(message)
        source = check_source(
            source or wired.MessageSource(kind="coordinator", sender_session_id=parent.session_id)
        )
        # Every value was checked just above: built without pydantic checking it again.
        send = wired.SendMessage.checked(
            parent, blocks, source, op.message(blocks, source) if op is not None else None
        )
        return router, send

    def _route(self, child_id: str, send: SendMessage) -> SendResult:
        """Hand ``send`` to the child's supervisor here and return what it did."""
        root = self._require_store()
        return _wiring().deliver(self._routes, root, child_id, send, check_open=self._check_open)

    # -- inspection ------------------------------------------------------------------

    def children(self, parent: AgentHandle | str) -> list[ChildView]:
        """Every child of ``parent``: durable ones from the store, plus those still starting.

        Oldest first; ``running`` when the child's newest Task in this process is running.
        """
        from controlplane.contract import AgentHandle
        from controlplane.runtime._child_views import child_views

        session = parent.session_id if isinstance(parent, AgentHandle) else parent
        tasks = self._tasks.list(session)  # first: see `child_views`
        stored = self._store.list_children(session) if self._store is not None else []
        return child_views(tasks, stored)

    def dump_tree(self, *, timeout_s: float = 0.25) -> ActorTree:
        """The actor tree right now; a supervisor busier than ``timeout_s`` shows as busy."""
        from controlplane.contract import ActorTree, utcnow
        from controlplane.runtime.spend._admission import placed_nodes

        nodes = []
        if self._root is not None and not self._closed:
            import pykka

            try:
                nodes = self._root.describe_all(timeout_s)
            except (pykka.ActorDeadError, pykka.Timeout):
                nodes = []
        nodes = placed_nodes(nodes, self._tasks)
        forwarded = self._router.in_flight() if self._router is not None else []
        return ActorTree(
            taken_at=utcnow(), closed=self._closed, supervisors=nodes,
            runtime_id=self._runtime_id, forwarded=forwarded,
        )  # fmt: skip

    def serve_admin(self, path: str | os.PathLike[str]) -> AdminServer:
        """Serve the read-only admin socket (mode 0600) at ``path`` until `close`."""
        from controlplane.runtime._admin import AdminServer

        self._check_open()
        server = AdminServer(path, dump=self.dump_tree).start()
        with self._lock:
            self._admin_servers.append(server)
        return server

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

    def _open_store(self) -> SqlStore:
        """The store, for a call that reads or writes it directly (`SpendApi`)."""
        self._check_open()
        self._require_store()
        assert self._store is not None  # the root is built with the store
        return self._store

    def _require_router(self) -> Router:
        self._require_store()
        assert self._router is not None  # built with the store, as the root is
        return self._router

    def _check_parent(self, parent: object) -> None:
        if not isinstance(parent, _wiring().AgentHandle):
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
        from actors import SpawnChild

        self._require_store().spawn_child(SpawnChild(plan=plan))

    def _sweep_soon(self) -> None:
        if self._heartbeat is not None and not self._closed:
            self._heartbeat.sweep_soon()

    def _recover_here(self, task: TaskSnapshot, fence: int, recovery: int) -> None:
        """Start a running Task taken over from a runtime that ended, its child claimed
        here already (`controlplane.runtime.lease._recovery.RecoverHere`): same Task, same turn."""
        assert task.child_id is not None
        from actors import SendMessage
        from controlplane.contract import AgentHandle, MessageSource

        parent = AgentHandle(self.agents, task.owner_session, model=None, depth=0)
        source = MessageSource(kind="system", sender_session_id="recovery")
        send = SendMessage(
            parent=parent, message=(), source=source, continues=task.id,
            recovered=(task.model_copy(update={"recoveries": recovery}), fence, recovery),
        )  # fmt: skip
        self._route(task.child_id, send)

    def _kill_here(self, task_id: str, reason: str) -> bool:
        """Abort a Task of this runtime whose kill another runtime forwarded (the router's
        ``kill_here``: the Task service is built after the router)."""
        return self._tasks.kill_here(task_id, reason)

    def _kill_tasks_of(self, agent: AgentHandle) -> None:
        self._tasks.kill_owned_by(agent.session_id, f"owner session {agent.session_id} disposed")


class _Wired(NamedTuple):
    """What a send uses from the contract and the actors, imported on first use."""

    AgentHandle: type[AgentHandle]
    MessageSource: type[MessageSource]
    SendMessage: type[SendMessage]
    deliver: Callable[..., SendResult]


_wired: list[_Wired] = []


def _wiring() -> _Wired:
    """The classes and functions a send uses, imported once: this module imports neither
    at load (what `from controlplane import SubagentControl` pays), and an import
    statement in a function costs a lookup per call, several per steer."""
    if not _wired:
        from actors import SendMessage, deliver
        from controlplane.contract import AgentHandle, MessageSource

        _wired.append(_Wired(AgentHandle, MessageSource, SendMessage, deliver))
    return _wired[0]
