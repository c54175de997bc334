"""Without a configured provider nothing is emitted; without opentelemetry-api at all the
control plane works the same (spans and metrics off, the lifecycle logs on); a global
provider set by the host is used when no explicit one is passed."""

from __future__ import annotations

import textwrap
import threading

import pytest

from controlplane import AgentHandle, SubagentControl
from tests.fakes import FakeProvider
from tests.support import MakeControl, run_python, running_child, settle, text
from tests.telemetry.conftest import HAS_SDK, SDK_MISSING, Otel

pytestmark = pytest.mark.timeout(60)

_SCENARIO = """
    import logging, threading
    from controlplane import ContinuableStartSpec, SubagentControl, TextBlock
    from tests.fakes import FakeProvider
    from tests.support import running_child, settle, text

    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.subagent_event)
    logging.getLogger("controlplane.lifecycle").addHandler(Keep())
    logging.getLogger("controlplane.lifecycle").setLevel(logging.INFO)

    provider = FakeProvider()
    control = SubagentControl.open(URL)
    control.providers.register(provider)
    parent = control.agents.register("parent-1")
    hold = threading.Event()
    child_id, task_id, _ = running_child(control, parent, provider, hold)
    assert control.send_message(parent, child_id, text("steer")).route == "steered"
    control.tasks.kill(task_id, requester=parent)
    settle(control, task_id, parent)
    resumed = control.send_message(parent, child_id, text("resume"))
    assert settle(control, resumed.task_id, parent).status.value == "completed"
    control.close()
"""


def _run(url: str, prelude: str, check: str) -> str:
    code = textwrap.dedent(prelude) + textwrap.dedent(_SCENARIO).replace("URL", repr(url))
    done = run_python("-c", code + textwrap.dedent(check), timeout=60.0)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_without_opentelemetry_installed_everything_works_and_only_logs_are_emitted(
    sqlite_url: str,
) -> None:
    blocked = """
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
    """
    out = _run(
        sqlite_url,
        blocked,
        """
        assert not control.telemetry.enabled
        assert "opentelemetry" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        print(lines)
        """,
    )
    assert out.strip() == str(
        ["start", "publish", "steer", "kill", "settle", "start", "publish", "settle"]
    )


def test_with_the_api_but_no_provider_configured_nothing_is_emitted(
    make_control: MakeControl,
    provider: FakeProvider,
    hold: threading.Event,
    otel: Otel,
) -> None:
    control = make_control()  # no providers passed, and no global one set
    parent = control.agents.register("parent-1")
    harness = otel.tracer_provider.get_tracer("harness")
    with harness.start_as_current_span("tool subagent"):
        child_id, task_id, _ = running_child(control, parent, provider, hold)
        control.send_message(parent, child_id, text("steer"))
    control.tasks.kill(task_id, requester=parent)
    settle(control, task_id, parent)

    assert control.telemetry.enabled
    assert [s.name for s in otel.spans()] == ["tool subagent"]
    assert otel.points("subagent.activations") == []


@pytest.mark.slow
def test_a_global_provider_set_by_the_host_is_used(sqlite_url: str) -> None:
    if not HAS_SDK:
        pytest.skip(SDK_MISSING)
    host = """
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    """
    out = _run(
        sqlite_url,
        host,
        """
        names = sorted({s.name for s in exporter.get_finished_spans()})
        data = reader.get_metrics_data()
        metric_names = sorted(
            m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
        )
        print(names)
        print("subagent.activations" in metric_names)
        """,
    )
    spans, counted = out.strip().splitlines()
    assert "subagent.activation" in spans
    assert "subagent.send" in spans
    assert counted == "True"


def test_the_control_plane_exposes_its_telemetry(
    control: SubagentControl, parent: AgentHandle
) -> None:
    assert control.telemetry.runtime_id == control.runtime_id


@pytest.mark.slow
def test_a_global_provider_set_after_the_control_plane_opened_is_used_from_then_on(
    sqlite_url: str,
) -> None:
    # While the global provider is the API's proxy, no span is even created (the hot
    # paths skip it); the check is made per operation, so a provider set later counts.
    if not HAS_SDK:
        pytest.skip(SDK_MISSING)
    code = f"""
        import threading
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from controlplane import SubagentControl
        from tests.fakes import FakeProvider
        from tests.support import running_child, settle, text

        provider = FakeProvider()
        control = SubagentControl.open({sqlite_url!r})
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        child_id, task_id, _ = running_child(control, parent, provider, threading.Event())
        assert control.send_message(parent, child_id, text("before")).route == "steered"

        exporter = InMemorySpanExporter()
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(sdk)
        assert control.send_message(parent, child_id, text("after")).route == "steered"
        control.tasks.kill(task_id, requester=parent)
        settle(control, task_id, parent)
        control.close()
        print([s.name for s in exporter.get_finished_spans()])
    """
    done = run_python("-c", textwrap.dedent(code), timeout=60.0)
    assert done.returncode == 0, done.stderr
    # The second steer's send span and the kill's; the activation began before: it has
    # none.
    assert done.stdout.strip() == str(["subagent.send", "subagent.kill"])


@pytest.mark.slow
def test_a_send_skipped_as_quiet_is_recorded_once_the_host_sets_a_meter_or_a_log_level(
    sqlite_url: str,
) -> None:
    # With nothing configured a send emits nothing and skips its bookkeeping; the check is
    # made per call, so a meter provider or an INFO level set later counts at once.
    if not HAS_SDK:
        pytest.skip(SDK_MISSING)
    code = f"""
        import logging, threading
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from controlplane import SubagentControl
        from tests.fakes import FakeProvider
        from tests.support import running_child, settle, text

        lines = []
        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(record.subagent_event)
        logger = logging.getLogger("controlplane.lifecycle")
        logger.addHandler(Keep())
        logger.setLevel(logging.WARNING)

        provider = FakeProvider()
        control = SubagentControl.open({sqlite_url!r})
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        child_id, task_id, _ = running_child(control, parent, provider, threading.Event())
        assert control.telemetry.quiet()
        assert control.send_message(parent, child_id, text("quiet")).route == "steered"

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert not control.telemetry.quiet()
        assert control.send_message(parent, child_id, text("metered")).route == "steered"
        logger.setLevel(logging.INFO)
        assert control.send_message(parent, child_id, text("logged")).route == "steered"
        control.tasks.kill(task_id, requester=parent)
        settle(control, task_id, parent)
        control.close()
        sends = [
            point.value
            for r in reader.get_metrics_data().resource_metrics
            for s in r.scope_metrics for m in s.metrics if m.name == "subagent.sends"
            for point in m.data.data_points
        ]
        print(sum(sends), lines.count("steer"))
    """
    done = run_python("-c", textwrap.dedent(code), timeout=60.0)
    assert done.returncode == 0, done.stderr
    # Counted: the two sends after the meter was set; logged: the one after INFO was.
    assert done.stdout.split() == ["2", "1"]


def test_while_no_provider_is_set_the_providers_global_is_read_not_the_environment() -> None:
    # The API's getter looks the environment up on every call while nothing is set (~3 µs
    # a send, twice); the quiet check reads the global instead, and still sees a provider
    # set later, and asks the getter again if the global is unset after a provider.
    from types import SimpleNamespace

    from controlplane.telemetry._otel import _provider_getter

    stand_in, sdk = object(), object()
    module = SimpleNamespace(_PROVIDER=None)
    calls: list[None] = []

    def getter() -> object:
        calls.append(None)
        return module._PROVIDER or stand_in

    current = _provider_getter(module, "_PROVIDER", getter)
    assert [current() for _ in range(3)] == [stand_in] * 3
    assert len(calls) == 1  # the first, at load: it would load an environment's provider
    module._PROVIDER = sdk
    assert current() is sdk
    assert len(calls) == 1
    # A global the API no longer has by that name: its getter is used as it is.
    assert _provider_getter(SimpleNamespace(), "_PROVIDER", getter) is getter


def test_a_provider_the_environment_names_is_loaded_and_recorded_to(sqlite_url: str) -> None:
    if not HAS_SDK:
        pytest.skip(SDK_MISSING)
    code = f"""
        from opentelemetry import trace
        from controlplane import SubagentControl

        control = SubagentControl.open({sqlite_url!r})
        print(control.telemetry.quiet(), type(trace.get_tracer_provider()).__module__)
        control.close()
    """
    env = {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    done = run_python("-c", textwrap.dedent(code), timeout=60.0, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "opentelemetry.sdk.trace"]
