"""The layout shows the architecture: imports run one way, front → runtime → actors →
persistence → contract, with the providers and the telemetry beside the runtime, each
importing only the contract; inside the runtime, its wings (tasks, lease, routing, spend,
approvals) import only the runtime's shared modules and the wings they declare.

Checked twice: statically, every import statement of the three packages (including those
under ``TYPE_CHECKING`` and inside functions) against the layer it may reach; and at run
time, what importing one package alone loads in a fresh interpreter.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from benchmarks.walk import REACHES, layer_of
from tests.support import REPO, run_python

PACKAGES = ("controlplane", "actors", "persistence")

# Which layers a module of each layer may import (its own included), and the layer of a
# module of ours: one map, which the walk benchmark (a call up a layer is a call into a
# layer the caller may not import) reads too.
ALLOWED = REACHES

# The sub-packages whose underscore modules nobody outside them imports.
SUBPACKAGES = ("contract", "telemetry", "providers", "cli")

# The runtime's wings (`controlplane/runtime/<wing>/`) and the other wings each may import:
# a wing imports the layers below the runtime, the runtime's shared modules and these,
# never the facade at the runtime's top (which wires them all) nor an undeclared wing.
WINGS: dict[str, frozenset[str]] = {
    "tasks": frozenset(),
    "lease": frozenset({"tasks"}),
    "routing": frozenset({"lease"}),
    "spend": frozenset({"lease", "tasks"}),
    "approvals": frozenset({"lease", "tasks"}),
}
RUNTIME_SHARED = frozenset(
    {
        "controlplane.runtime._validate",
        "controlplane.runtime._usage_text",
        "controlplane.runtime._defaults",
    }
)
"""The runtime's top-level modules every wing may use: argument checks, usage texts and
the options' defaults."""

# What may sit at the top of `controlplane/`: the package and its public modules. The
# runtime lives in `controlplane/runtime/`, the fronts in `controlplane/fronts/`.
TOP_MODULES = frozenset({"__init__.py", "aio.py", "models.py", "tools.py"})


def modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path) -> set[str]:
    """The modules of ours that ``name`` imports, wherever the statement stands."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
    return {module for module in found if module.split(".")[0] in PACKAGES}


def test_the_layer_map_knows_every_module() -> None:
    assert {layer_of(name) for name in modules()} == set(ALLOWED)


def test_no_import_runs_up_between_layers() -> None:
    upward = sorted(
        f"{name} ({layer_of(name)}) imports {target} ({layer_of(target)})"
        for name, path in modules().items()
        for target in imports_of(name, path)
        if layer_of(target) not in ALLOWED[layer_of(name)]
    )
    assert upward == []


def wing_of(module: str) -> str | None:
    """The runtime wing a module belongs to (None outside the wings)."""
    parts = module.split(".")
    if parts[:2] == ["controlplane", "runtime"] and len(parts) > 2 and parts[2] in WINGS:
        return parts[2]
    return None


def test_the_wings_are_known_and_their_declared_imports_run_one_way() -> None:
    wings = {p.name for p in (REPO / "controlplane" / "runtime").iterdir() if p.is_dir()}
    assert wings - {"__pycache__"} == set(WINGS)
    order: list[str] = []  # a wing after every wing it imports: no cycle among them
    while len(order) < len(WINGS):
        ready = [w for w, deps in WINGS.items() if w not in order and deps <= set(order)]
        assert ready, f"the wings' declared imports form a cycle: {WINGS}"
        order += sorted(ready)


def test_a_wing_imports_only_the_runtime_s_shared_modules_and_its_declared_wings() -> None:
    crossing = sorted(
        f"{name} ({wing}) imports {target}"
        for name, path in modules().items()
        if (wing := wing_of(name)) is not None
        for target in imports_of(name, path)
        if layer_of(target) == "runtime"
        and not (wing_of(target) in WINGS[wing] | {wing} or target in RUNTIME_SHARED)
    )
    assert crossing == []


def test_the_top_of_controlplane_holds_only_its_public_modules() -> None:
    top = {p.name for p in (REPO / "controlplane").glob("*.py")}
    assert top == TOP_MODULES, "a runtime module belongs in controlplane/runtime/<wing>/"


def test_no_module_imports_the_underscore_modules_of_another_sub_package() -> None:
    reaching_in = sorted(
        f"{name} imports {target}"
        for name, path in modules().items()
        for target in imports_of(name, path)
        for sub in SUBPACKAGES
        if target.startswith(f"controlplane.{sub}._") and not name.startswith(f"controlplane.{sub}")
    )
    assert reaching_in == []


def loaded_by(statement: str) -> list[str]:
    """The modules of ours that ``statement`` loads in a fresh interpreter."""
    code = f"""
        import sys
        {statement}
        ours = sorted(m for m in sys.modules if m.split(".")[0] in {PACKAGES!r})
        print("\\n".join(ours))
        """
    done = run_python("-c", textwrap.dedent(code), timeout=60.0)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def outside(loaded: list[str], *allowed: str) -> list[str]:
    """The loaded modules that are none of ``allowed`` nor inside one of them."""
    return [m for m in loaded if not any(m == a or m.startswith(f"{a}.") for a in allowed)]


_EVERY_CONTRACT_NAME = "import controlplane.contract as c; [getattr(c, n) for n in c.__all__]"
"""The contract loads each name's module on first use: this loads them all."""


def test_importing_the_contract_loads_nothing_outside_it() -> None:
    loaded = loaded_by(_EVERY_CONTRACT_NAME)

    assert "controlplane.contract._errors" in loaded  # it did load
    # `controlplane` itself runs first: the contract is its sub-package.
    assert outside(loaded, "controlplane.contract") == ["controlplane"]


def test_importing_persistence_loads_only_the_contract_of_ours() -> None:
    # Like the contract, the package loads each name's module on first use: load them all.
    loaded = loaded_by("import persistence as p; [getattr(p, n) for n in p.__all__]")

    assert outside(loaded, "persistence", "controlplane.contract") == ["controlplane"]


def test_importing_actors_loads_no_runtime_provider_telemetry_or_front_module() -> None:
    loaded = loaded_by("import actors")

    assert outside(loaded, "actors", "persistence", "controlplane.contract") == ["controlplane"]


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("controlplane", ()),
        ("controlplane.providers", ("controlplane.providers",)),
        ("controlplane.models", ("controlplane.models", "controlplane.providers")),
        ("controlplane.telemetry", ("controlplane.telemetry",)),
    ],
)
def test_a_side_package_loads_only_itself_and_the_contract(
    package: str, allowed: tuple[str, ...]
) -> None:
    loaded = loaded_by(f"import {package}")

    assert outside(loaded, "controlplane.contract", *allowed) == ["controlplane"]


def test_importing_every_public_module_warns_of_nothing() -> None:
    """A warning at import lands on the stderr of every CLI run and every harness (pydantic
    before 2.10 warned of each model field named ``model_*``; the lowest-pins CI pass runs
    this test on such a pydantic)."""
    modules = "controlplane, controlplane.tools, controlplane.aio, controlplane.models, "
    modules += "controlplane.cli, controlplane.telemetry, actors, persistence"
    done = run_python(
        "-W", "error", "-c", f"import {modules}; {_EVERY_CONTRACT_NAME}", timeout=60.0
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
