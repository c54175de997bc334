"""The model-facing tools' arguments: pydantic models, their JSON schemas and parsing.

Each tool's arguments are one strict model (no coercion, no extra keys), so the schema the
model is shown and the check its arguments pass are the same object. Parsing turns every
problem into one ``INVALID_INPUT`` error whose message names each bad argument and what
the model can do, before anything is started, sent or written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from controlplane.contract import LIMITS, ErrorCode, SubagentControlError

__all__ = [
    "MAX_ARGUMENTS_CHARS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_ID_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_TIMEOUT_S",
    "TOOLS",
    "AnswerArgs",
    "ListAgentsArgs",
    "SendMessageArgs",
    "SetBudgetArgs",
    "SubagentArgs",
    "TaskKillArgs",
    "TaskListArgs",
    "TaskOutputArgs",
    "ToolSpec",
    "parse_arguments",
]

MAX_MESSAGE_CHARS: Final = 100_000
"""The longest ``prompt`` or ``message`` a tool accepts, in characters."""

MAX_DESCRIPTION_CHARS: Final = 1_000
"""The longest ``description`` (a child's label; the store keeps up to this many)."""

MAX_ID_CHARS: Final = 200
"""The longest id a tool accepts (ids are UUIDs; this only bounds garbage)."""

MAX_TIMEOUT_S: Final = 600.0
"""The longest ``task_output`` wait, in seconds: a tool call must come back to the model."""

DEFAULT_TIMEOUT_S: Final = 30.0

MAX_ARGUMENTS_CHARS: Final = 1_000_000
"""The longest raw JSON argument string parsed at all (a full-size message, escaped)."""


_MAX_PROBLEMS = 5


def _has_text(value: str) -> str:
    # A message of only whitespace would start (or steer) a turn about nothing.
    if not value.strip():
        raise ValueError("must contain some non-whitespace text")
    return value


# ``pattern`` shows the model the non-blank rule; the validator enforces it with Python's
# notion of whitespace, which the schema regex may not share.
_NON_BLANK: Final = {"pattern": r"\S"}

# Lengths are checked before the blank check, so a huge string is refused before it is read.
MessageText = Annotated[
    str,
    Field(min_length=1, max_length=MAX_MESSAGE_CHARS, json_schema_extra=_NON_BLANK),
    AfterValidator(_has_text),
]
Label = Annotated[
    str,
    Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS, json_schema_extra=_NON_BLANK),
    AfterValidator(_has_text),
]
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]


_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class SubagentArgs(BaseModel):
    """Arguments of ``subagent``."""

    model_config = _STRICT

    description: Label = Field(
        description="A short (3-5 word) label; list_agents and task_list show it."
    )
    prompt: MessageText = Field(
        description="The task for the subagent, with everything it needs to know."
    )


class SendMessageArgs(BaseModel):
    """Arguments of ``send_message``."""

    model_config = _STRICT

    subagent_id: Identifier = Field(
        description="The subagent's id, as returned by subagent or list_agents."
    )
    message: MessageText = Field(description="The message for the subagent.")


class TaskOutputArgs(BaseModel):
    """Arguments of ``task_output``."""

    model_config = _STRICT

    task_id: Identifier = Field(
        description="The task's id, as returned by subagent, send_message or task_list."
    )
    wait: bool = Field(default=False, description="Wait for the task to finish before answering.")
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=(
            "With wait, the longest to wait, in seconds; a task still running then is "
            "reported with status running."
        ),
    )


class TaskKillArgs(BaseModel):
    """Arguments of ``task_kill``."""

    model_config = _STRICT

    task_id: Identifier = Field(description="The id of the running task to stop.")


class TaskListArgs(BaseModel):
    """Arguments of ``task_list`` (none)."""

    model_config = _STRICT


class ListAgentsArgs(BaseModel):
    """Arguments of ``list_agents`` (none)."""

    model_config = _STRICT


class SetBudgetArgs(BaseModel):
    """Arguments of ``set_budget``: a child and at least one limit."""

    # `model_calls` is a tool argument's name; pydantic before 2.10 reserves the prefix
    # ``model_`` and warns at import (on stderr, in every CLI run) unless it is opened.
    model_config = ConfigDict(**_STRICT, protected_namespaces=())

    subagent_id: Identifier = Field(
        description="The subagent's id, as returned by subagent or list_agents."
    )
    tokens: int | None = Field(default=None, gt=0, description="Input plus output tokens.")
    cost: float | None = Field(default=None, gt=0, description="Cost, in the prices' unit.")
    model_calls: int | None = Field(default=None, gt=0, description="Model calls.")
    tool_calls: int | None = Field(default=None, gt=0, description="Tool calls.")
    seconds: float | None = Field(default=None, gt=0, description="Wall-clock seconds of work.")

    @model_validator(mode="after")
    def _some_limit(self) -> SetBudgetArgs:
        if all(getattr(self, name) is None for name in LIMITS):
            raise ValueError(f"give at least one limit ({', '.join(LIMITS)})")
        return self

    def limits(self) -> dict[str, float]:
        """The limits given."""
        return {name: value for name in LIMITS if (value := getattr(self, name)) is not None}


class AnswerArgs(BaseModel):
    """Arguments of ``answer``: an approval request, and whether to allow it."""

    model_config = _STRICT

    request_id: Identifier = Field(
        description="The request's id, as the subagent's notice or task_output shows it."
    )
    allow: bool = Field(description="true: the tool runs; false: it does not.")
    note: str | None = Field(
        default=None,
        max_length=MAX_MESSAGE_CHARS,
        description="Why, or what to do instead: the subagent reads it.",
    )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its name, what the model is told it does, and its argument model."""

    name: str
    description: str
    arguments: type[BaseModel]

    def definition(self) -> dict[str, Any]:
        """The ``{"name", "description", "parameters"}`` definition (a fresh copy)."""
        parameters = self.arguments.model_json_schema()
        # The class name and docstring are ours, not the model's business.
        parameters.pop("title", None)
        parameters.pop("description", None)
        properties = parameters.setdefault("properties", {})
        for schema in properties.values():
            schema.pop("title", None)
        parameters["additionalProperties"] = False
        return {"name": self.name, "description": self.description, "parameters": parameters}


TOOLS: Final[Mapping[str, ToolSpec]] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "subagent",
            "Start a subagent in the background on a task. Returns at once with the "
            "subagent's id and its task id; the subagent keeps its conversation, so you can "
            "send it follow-ups later with send_message. Read its answer with task_output.",
            SubagentArgs,
        ),
        ToolSpec(
            "send_message",
            "Send a message to one of your subagents. If it is working, the message joins "
            "its current turn; if it is idle, the message starts a new task continuing its "
            "conversation. Read the answer with task_output on the task id returned.",
            SendMessageArgs,
        ),
        ToolSpec(
            "task_output",
            "Read a task's output and status (running, completed, failed or killed). With "
            "wait=true, wait up to timeout_s seconds for it to finish first.",
            TaskOutputArgs,
        ),
        ToolSpec(
            "task_kill",
            "Stop a running task. The subagent keeps its conversation and can be sent "
            "more messages later.",
            TaskKillArgs,
        ),
        ToolSpec("task_list", "List your tasks: id, status and label.", TaskListArgs),
        ToolSpec(
            "list_agents",
            "List your subagents: id, whether one is running or ready for a message, and "
            "its label.",
            ListAgentsArgs,
        ),
        ToolSpec(
            "set_budget",
            "Set the spending limits of one of your subagents, counting everything it "
            "starts: they replace its budget, and what it has spent so far counts. A "
            "subagent its budget stopped can be sent messages again once the new limits "
            "leave it room.",
            SetBudgetArgs,
        ),
        ToolSpec(
            "answer",
            "Answer a subagent's request to run a tool that needs your approval (its task "
            "reads input_required until you do). allow=true runs the tool once; "
            "allow=false refuses it, and the subagent reads your note.",
            AnswerArgs,
        ),
    )
}


def parse_arguments(name: str, arguments: object) -> BaseModel:
    """Check a tool call: the tool exists and ``arguments`` (a mapping or JSON text) fit it.

    Raises:
        SubagentControlError: ``INVALID_INPUT``, naming every problem found.
    """
    spec = TOOLS.get(name) if isinstance(name, str) else None
    if spec is None:
        known = ", ".join(TOOLS)
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"there is no tool named {_clip(repr(name))}; the tools are: {known}",
        )
    payload = _decode(spec, arguments)
    try:
        return spec.arguments.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A model can read a few problems, not fifty thousand: name the first ones.
        problems = "; ".join(_describe(error) for error in errors[:_MAX_PROBLEMS])
        if len(errors) > _MAX_PROBLEMS:
            problems += f"; and {len(errors) - _MAX_PROBLEMS} more"
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"invalid arguments for {spec.name}: {problems}. Nothing was done; call "
            f"{spec.name} again with {_signature(spec)}",
        ) from None


def _decode(spec: ToolSpec, arguments: object) -> object:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, (str, bytes, bytearray)):
        raise _not_an_object(spec, f"a Python {type(arguments).__name__}")
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"the arguments for {spec.name} are {len(arguments):,} characters, over the "
            f"limit of {MAX_ARGUMENTS_CHARS:,}; nothing was done. Send less text "
            f"(a prompt or message may be up to {MAX_MESSAGE_CHARS:,} characters)",
        )
    try:
        payload = json.loads(arguments, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; absurd nesting recurses.
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"the arguments for {spec.name} are not valid JSON ({_clip(str(exc))}); nothing "
            f"was done. Call {spec.name} again with a JSON object {_signature(spec)}",
        ) from None
    if not isinstance(payload, dict):
        raise _not_an_object(spec, _json_kind(payload))
    return payload


def _not_an_object(spec: ToolSpec, got: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"the arguments for {spec.name} must be a JSON object, not {got}; nothing was done. "
        f"Call {spec.name} again with {_signature(spec)}",
    )


def _refuse_constant(token: str) -> object:
    raise ValueError(f"{token} is not a JSON number")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "a string"


_FRIENDLY = {
    "missing": "is required",
    "extra_forbidden": "is not an argument of this tool",
    "invalid_key": "is not an argument of this tool",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "float_type": "must be a number",
    "int_type": "must be a whole number",
    "finite_number": "must be a finite number",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "string_too_short": "must not be empty",
    "string_too_long": "is too long (at most {max_length:,} characters)",
}


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    template = _FRIENDLY.get(error["type"])
    if template is None:
        # Our own validators' messages ("Value error, must contain …"): keep the reason.
        text = str(error["msg"]).removeprefix("Value error, ")
    else:
        text = template.format(**error.get("ctx", {}))
    return f"{_clip(where, 60)!s} {text}"


_KINDS: Final[dict[object, str]] = {
    str: "string",
    str | None: "string",
    bool: "boolean",
    float: "number",
    int | None: "integer",
    float | None: "number",
}


def _signature(spec: ToolSpec) -> str:
    fields = spec.arguments.model_fields
    if not fields:
        return "{} (no arguments)"
    parts = []
    for field_name, info in fields.items():
        kind = _KINDS.get(info.annotation, "value")
        optional = "" if info.is_required() else "?"
        parts.append(f'"{field_name}"{optional}: {kind}')
    return "{" + ", ".join(parts) + "}"


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
