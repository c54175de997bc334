"""Tools a child can call: `ChildTool`, the descriptor's tool filter, and running one call.

A call never raises into the agent loop: an unknown tool, arguments that are not JSON or do
not fit the schema, and a handler that raises all become an *error result* the model reads
and can recover from. Outputs are bounded before they reach the transcript or the model, so
one runaway tool cannot bloat the child's durable history.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from controlplane.contract import (
    ApprovalPolicy,
    CancelSignal,
    ErrorCode,
    JsonValue,
    SubagentControlError,
    plain_json,
    seconds_problem,
)
from controlplane.providers._model import ToolCall, ToolDefinition

__all__ = [
    "MAX_TOOL_TEXT_CHARS",
    "ChildTool",
    "ToolOutcome",
    "bounded",
    "run_tool_call",
    "select_tools",
]

MAX_TOOL_TEXT_CHARS = 32_000
"""A tool's output or error beyond this many characters is cut, with a marker saying so."""

ToolHandler = Callable[..., object]
"""``handler(arguments)`` or ``handler(arguments, signal)``, returning the result text."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what Chat Completions accepts
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class ChildTool:
    """A tool a child agent can call.

    Args:
        name: The tool's name (letters, digits, ``_`` and ``-``; at most 64 characters).
        description: What the tool does, for the model.
        parameters: The JSON schema of the arguments (an ``object`` schema), or a pydantic
            model whose schema it is; with a model the arguments are validated by it and the
            handler gets the validated fields (defaults filled in).
        handler: ``handler(arguments: dict) -> str``. A handler that takes a second
            parameter gets the activation's `CancelSignal` too, so a kill can stop it. A
            raise becomes an error result the model reads.
        idempotent: Running the call twice does what running it once does. A call of an
            idempotent tool that a crash or kill left without a result is run again when
            the child resumes; any other is answered as interrupted, never run again (a
            tool that needs approval is never run again unasked).
        approval: Whether a call needs its parent's (or a person's) approval before it
            runs: ``"never"`` (the default), ``"always"``, or a callable on the
            parsed arguments returning True to ask (one that raises asks too). The request
            is written before anything runs; the child waits (its Task reads
            ``input_required``) until `SubagentControl.answer` allows or denies it.
        approval_deadline_s: Deny a request unanswered after this many seconds (the
            model reads why); None waits for the answer however long it takes.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a bad name, a schema that is not a JSON
            object, a handler that is not callable, an ``idempotent`` that is not a bool,
            or a bad approval policy or deadline.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, JsonValue] | type[BaseModel],
        handler: ToolHandler,
        *,
        idempotent: bool = False,
        approval: ApprovalPolicy = "never",
        approval_deadline_s: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"a tool name is 1-64 letters, digits, '_' or '-', not {name!r}",
            )
        if not callable(handler):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"the handler of tool {name!r} is not callable"
            )
        if not isinstance(idempotent, bool):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"idempotent of tool {name!r} must be True or False, not {idempotent!r}",
            )
        self._idempotent = idempotent
        self._model: type[BaseModel] | None = None
        if isinstance(parameters, type) and issubclass(parameters, BaseModel):
            self._model = parameters
            schema = parameters.model_json_schema()
        else:
            schema = plain_json(
                parameters, code=ErrorCode.INVALID_INPUT, what=f"the schema of tool {name!r}"
            )
            if not isinstance(schema, dict):
                raise SubagentControlError(
                    ErrorCode.INVALID_INPUT, f"the schema of tool {name!r} must be a JSON object"
                )
        self._definition = ToolDefinition(name=name, description=description, parameters=schema)
        self._handler = handler
        self._takes_signal = _takes_two_arguments(handler)
        if not (approval in ("never", "always") or callable(approval)):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"the approval of tool {name!r} must be 'never', 'always' or a callable on "
                f"its arguments, not {approval!r}",
            )
        if approval_deadline_s is not None and (problem := seconds_problem(approval_deadline_s)):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"approval_deadline_s of tool {name!r} {problem}"
            )
        self._approval = approval
        self.approval_deadline_s = approval_deadline_s
        """Seconds before an unanswered request is denied; None: no deadline."""

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with ``arguments`` must be approved before it runs (a policy
        callable that raises asks: the safe side)."""
        policy = self._approval
        if policy == "never":
            return False
        if policy == "always":
            return True
        assert callable(policy)
        try:
            return bool(policy(arguments))
        except Exception:
            return True

    @property
    def name(self) -> str:
        """The tool's name."""
        return self._definition.name

    @property
    def idempotent(self) -> bool:
        """Whether a call left without a result by a crash is run again on resume."""
        return self._idempotent

    @property
    def definition(self) -> ToolDefinition:
        """What the model is offered: name, description, JSON schema."""
        return self._definition

    def __call__(self, arguments: str, signal: CancelSignal) -> str:
        """Run the handler on ``arguments`` (JSON text); the result is bounded.

        Raises:
            ToolError: the arguments are not JSON or do not fit the schema.
            Exception: what the handler raised.
        """
        value = _parse_arguments(arguments)
        if self._model is not None:
            try:
                value = self._model.model_validate(value).model_dump(mode="json")
            except ValidationError as exc:
                raise ToolError(f"invalid arguments: {_pydantic_problem(exc)}") from None
        elif problem := _schema_problem(self._definition.parameters, value, "$"):
            raise ToolError(f"invalid arguments: {problem}")
        out = self._handler(value, signal) if self._takes_signal else self._handler(value)
        if not isinstance(out, str):
            raise ToolError(f"the tool returned {type(out).__name__}, not text")
        return out

    def __repr__(self) -> str:
        return f"<ChildTool {self.name!r}>"


class ToolError(Exception):
    """A call the tool could not take; its text is the error result the model reads."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A finished call: exactly one of ``output`` and ``error`` is set (both bounded)."""

    output: str | None = None
    error: str | None = None

    def event_data(self, call_id: str) -> dict[str, JsonValue]:
        """The ``tool/result`` event's data."""
        if self.error is not None:
            return {"id": call_id, "error": self.error}
        return {"id": call_id, "output": self.output or ""}


def select_tools(
    tools: Sequence[ChildTool], tool_filter: Mapping[str, JsonValue] | None
) -> list[ChildTool]:
    """The tools a child with ``tool_filter`` (``{"allow": [...], "deny": [...]}``) sees.

    Without ``allow`` every tool is allowed; ``deny`` removes names after that.

    Raises:
        SubagentControlError: ``INVALID_DESCRIPTOR`` when ``allow`` or ``deny`` is not a
            list of names.
    """
    if not tool_filter:
        return list(tools)
    allow = _names(tool_filter, "allow")
    deny = _names(tool_filter, "deny") or set()
    return [t for t in tools if (allow is None or t.name in allow) and t.name not in deny]


def run_tool_call(
    tools: Mapping[str, ChildTool], call: ToolCall, signal: CancelSignal
) -> ToolOutcome:
    """Run ``call`` on the tool it names; every failure becomes an error result."""
    tool = tools.get(call.name)
    if tool is None:
        offered = ", ".join(sorted(tools)) or "none"
        return ToolOutcome(error=bounded(f"unknown tool {call.name!r}; the tools are: {offered}"))
    try:
        return ToolOutcome(output=bounded(tool(call.arguments, signal)))
    except ToolError as exc:
        return ToolOutcome(error=bounded(str(exc)))
    except Exception as exc:
        return ToolOutcome(error=bounded(f"{type(exc).__name__}: {exc}"))


def bounded(text: str, limit: int = MAX_TOOL_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters with a marker, and made storable as UTF-8."""
    if len(text) > limit:
        text = f"{text[:limit]}\n…[truncated: {len(text) - limit:,} more characters not shown]"
    # A lone surrogate has no UTF-8 form: no store could keep it, and the turn would fail.
    return text.encode("utf-8", "replace").decode("utf-8")


def _names(tool_filter: Mapping[str, JsonValue], key: str) -> set[str] | None:
    value = tool_filter.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise SubagentControlError(
            ErrorCode.INVALID_DESCRIPTOR,
            f"tool_filter[{key!r}] must be a list of tool names, not {value!r}",
        )
    return set(value)


def _takes_two_arguments(handler: ToolHandler) -> bool:
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature take one argument
        return False
    kinds = [p.kind for p in params]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(kind in positional for kind in kinds) >= 2


def _parse_arguments(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError as exc:
        raise ToolError(
            f"the arguments are not valid JSON ({exc}): {bounded(arguments, 200)}"
        ) from None
    if not isinstance(value, dict):
        raise ToolError(f"the arguments must be a JSON object, not {type(value).__name__}")
    return value


def _pydantic_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    return f"{where}: {error['msg']}"


def _schema_problem(schema: JsonValue, value: JsonValue, path: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (the common JSON-schema keywords), or None.

    Checked: ``type``, ``enum``, ``const``, ``properties``, ``required``,
    ``additionalProperties`` and ``items``; other keywords are left to the tool.
    """
    if not isinstance(schema, dict):
        return None
    kinds = schema.get("type")
    if kinds is not None and not _is_any_type(value, kinds):
        return f"{path} must be {kinds}, not {_json_type(value)}"
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        return f"{path} must be one of {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{path} must be {schema['const']!r}"
    if isinstance(value, dict):
        return _object_problem(schema, value, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if problem := _schema_problem(schema["items"], item, f"{path}[{i}]"):
                return problem
    return None


def _object_problem(
    schema: dict[str, JsonValue], value: dict[str, JsonValue], path: str
) -> str | None:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    for key in required if isinstance(required, list) else []:
        if key not in value:
            return f"{path}.{key} is required"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            sub = properties[key]
        elif extra is False:
            return f"{path} has an unknown property {key!r}"
        else:
            sub = extra
        if problem := _schema_problem(sub, item, f"{path}.{key}"):
            return problem
    return None


def _is_any_type(value: JsonValue, kinds: JsonValue) -> bool:
    names = kinds if isinstance(kinds, list) else [kinds]
    for name in names:
        expected = _TYPES.get(name) if isinstance(name, str) else None
        if expected is None:
            return True  # a type we do not know: leave it to the tool
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if name == "integer" and isinstance(value, float):
            if value.is_integer():
                return True
            continue
        if isinstance(value, expected):
            return True
    return False


def _json_type(value: JsonValue) -> str:
    for name, expected in _TYPES.items():
        if name in ("integer", "number") and isinstance(value, bool):
            continue
        if isinstance(value, expected):
            return name
    return type(value).__name__
