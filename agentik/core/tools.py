"""In-agent tools: what a plugin registers through ``register_tools``.

A tool's function takes the decoded JSON arguments as keyword arguments and returns text
(anything else is JSON-encoded). ``async def`` functions are awaited; plain functions run on
the event loop, so a tool doing blocking I/O should be ``async`` or use a thread itself.

Arguments are checked against the tool's JSON schema first (a validator compiled once per
tool): a model that passes ``{"sides": "six"}`` gets an error result saying what was expected,
and the tool never sees it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentik.core.failures import log_failure
from agentik.core.tool_schema import converter, signature_schema

log = logging.getLogger(__name__)

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model sees: a function name, a description and a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True, slots=True)
class Tool:
    spec: ToolSpec
    fn: Callable[..., Any]
    plugin: str | None = None
    #: running it twice with the same arguments does no more than running it once: a call a
    #: crash cut after it started is run again when the turn resumes (else the model is told)
    idempotent: bool = False
    #: a person approves each call before it runs (the ``approvals`` plugin holds it)
    requires_approval: bool = False
    #: it changes or deletes what it reaches (MCP's ``destructiveHint``):
    #: ``AGENTIK_TOOL_APPROVAL=destructive`` holds its calls for approval
    destructive: bool = False

    @property
    def name(self) -> str:
        return self.spec.name


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    idempotent: bool = False,
    requires_approval: bool = False,
) -> Any:
    """Make a :class:`Tool` from a function: its JSON schema comes from the parameters' type
    hints and defaults, the description and each parameter's from the docstring
    (:mod:`agentik.core.tool_schema`); the function gets its arguments as those types (an
    ``Enum`` member, a dataclass, a pydantic model), not as raw JSON.

    ``@tool`` or ``@tool(name=..., description=..., parameters=..., idempotent=...)``
    (``parameters``: a JSON schema of your own; the function then gets the decoded JSON as it
    is; ``idempotent``: a second run with the same arguments does no more than the first, so a
    call a crash cut is run again when its turn resumes; ``requires_approval``: a person
    approves each call before it runs).
    """

    def build(f: Callable[..., Any]) -> Tool:
        if parameters is not None:
            summary, schema, call = inspect.getdoc(f) or "", parameters, f
        else:
            summary, schema, converters = signature_schema(f)
            call = _converting(f, converters) if converters else f
        doc = description if description is not None else summary
        spec = ToolSpec(name or f.__name__, doc, schema)
        return Tool(spec, call, idempotent=idempotent, requires_approval=requires_approval)

    return build(fn) if fn is not None else build


def _converting(f: Callable[..., Any], converters: dict[str, Any]) -> Callable[..., Any]:
    """``f`` taking the decoded JSON arguments, turned into its parameters' types first."""
    convert = converter(converters)

    @functools.wraps(f)
    def call(**kwargs: Any) -> Any:
        return f(**convert(kwargs))

    return call


class ToolError(Exception):
    """Raise from a tool to give the model an error result with this message."""


class ToolRegistry:
    """The tools of the agent, by name. Invoking never raises: failures become error text."""

    def __init__(self, tools: Iterable[Tool] = (), *, timeout: float | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        #: tool name -> (compiled validator or None: no check, its fast path for flat schemas)
        self._validators: dict[str, tuple[Any, Callable[[dict[str, Any]], bool] | None]] = {}
        self.timeout = timeout  # seconds an async tool may take before it gives an error
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> None:
        if not TOOL_NAME.match(t.name):
            raise ValueError(f"tool name {t.name!r} must match {TOOL_NAME.pattern}")
        if t.name in self._tools:
            other = self._tools[t.name].plugin
            raise ValueError(f"tool {t.name!r} registered twice (by {other} and {t.plugin})")
        self._tools[t.name] = t

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def idempotent(self, name: str) -> bool:
        t = self._tools.get(name)
        return t is not None and t.idempotent

    def problem(self, name: str, args: Any) -> str | None:
        """What is wrong with ``args`` for the tool ``name`` (its JSON schema), or None: how a
        person's edit of a call's arguments is checked before the call runs with them."""
        t = self._tools.get(name)
        if t is None:
            return f"there is no tool {name!r}"
        if not isinstance(args, dict):
            return "the arguments must be a JSON object"
        return self._check(t, args)

    async def invoke(self, name: str, args_json: str) -> tuple[str, bool]:
        """Run a tool; return ``(text, is_error)``. Unknown tools and bad JSON are errors."""
        t = self._tools.get(name)
        if t is None:
            return f"Error: unknown tool {name!r}", True
        try:
            args = json.loads(args_json) if args_json.strip() else {}
        except ValueError as e:
            return f"Error: arguments are not valid JSON ({e})", True
        if not isinstance(args, dict):
            return "Error: arguments must be a JSON object", True
        problem = self._check(t, args)
        if problem:
            return f"Error: invalid arguments for {name}: {problem}", True
        try:
            result = t.fn(**args)
            if inspect.isawaitable(result):
                async with asyncio.timeout(self.timeout):
                    result = await result
        except TimeoutError:
            log.warning(
                "tool %s did not answer within %g s (AGENTIK_TOOL_TIMEOUT)", _of(t), self.timeout
            )
            return f"Error: {name} did not answer within {self.timeout:g} s", True
        except ToolError as e:
            return f"Error: {e}", True
        except TypeError as e:
            return f"Error: bad arguments for {name}: {e}", True
        except Exception as e:
            log_failure(f"tool {_of(t)}", e, log)
            return f"Error: {type(e).__name__}: {e}", True
        if isinstance(result, str):
            return result, False
        return json.dumps(result, ensure_ascii=False, default=str), False

    def _check(self, t: Tool, args: dict[str, Any]) -> str | None:
        """What is wrong with ``args`` for this tool's schema, in words the model can act on."""
        if t.name not in self._validators:
            self._validators[t.name] = _compile(t)
        validator, quick = self._validators[t.name]
        if validator is None or (quick is not None and quick(args)):
            return None
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if not errors:
            return None
        return "; ".join(_describe(e) for e in errors[:3])


def _of(t: Tool) -> str:
    return f"{t.name} of plugin {t.plugin}" if t.plugin else t.name


def _compile(t: Tool) -> tuple[Any, Callable[[dict[str, Any]], bool] | None]:
    """The tool's jsonschema validator, and for the flat schemas ``@tool`` makes a plain check
    that says "valid" exactly when jsonschema would, at a tenth of its cost (jsonschema's
    walk costs tens of µs per call; it is still what explains a failure)."""
    import jsonschema  # imported at the first tool call, not at start-up

    schema = t.spec.parameters
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        log.warning("tool %s has an invalid JSON schema, arguments are not checked: %s", t.name, e)
        return None, None
    return cls(schema), _flat_check(schema)


def _is_integer(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, float) and v.is_integer()
    )


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _flat_check(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """For ``{"type": "object", "properties": {name: {"type": T}}, "required": [...]}`` and
    nothing more: a check of exactly that; None for any other schema."""
    if set(schema) - {"type", "properties", "required", "description", "title"}:
        return None
    if schema.get("type", "object") != "object":
        return None
    properties = schema.get("properties", {})
    checks = {}
    for name, prop in properties.items():
        if not isinstance(prop, dict) or set(prop) - {"type", "description", "title", "default"}:
            return None
        check = (
            _TYPE_CHECKS.get(prop.get("type", "")) if isinstance(prop.get("type"), str) else None
        )
        if check is None:
            return None
        checks[name] = check
    required = tuple(schema.get("required", ()))

    def valid(args: dict[str, Any]) -> bool:
        return all(name in args for name in required) and all(
            check(args[name]) for name, check in checks.items() if name in args
        )

    return valid


def _describe(error: Any) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)
