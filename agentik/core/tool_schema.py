"""A tool's JSON schema from its function's signature, and its arguments back into those types.

``str``, ``int``, ``float``, ``bool``, ``list[...]`` / ``set[...]`` / ``tuple[...]``,
``dict[str, ...]``, ``X | None`` and other unions, ``Literal[...]``, ``Enum``, ``TypedDict``,
dataclasses and pydantic models (nested as deep as they go), ``Annotated[X, "description"]``,
defaults, and per-parameter descriptions from the docstring (Google ``Args:``, Sphinx
``:param x:`` or NumPy ``Parameters``) all become a JSON schema a model can follow. A type that
has no JSON form is refused when the tool is made, naming the parameter, never guessed.

pydantic is never imported here: a pydantic model is recognised by its methods, and only a
plugin that uses one has pydantic loaded already.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

Schema = dict[str, Any]
Convert = Callable[[Any], Any]

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolTypeError(TypeError):
    """A parameter whose type cannot be described as JSON; the message names it."""


def signature_schema(fn: Callable[..., Any]) -> tuple[str, Schema, dict[str, Convert]]:
    """``(description, parameters schema, converters)`` of ``fn``: the docstring's text without
    its parameter section, the JSON schema of its parameters, and for each parameter whose
    Python type is not what JSON decodes to (an Enum, a dataclass, a pydantic model, a set,
    nested in lists or not) the function that turns the decoded value into it."""
    name = getattr(fn, "__name__", "tool")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as e:
        raise ToolTypeError(
            f"tool {name}: an annotation cannot be resolved ({e}); define the types a tool "
            "uses at module level"
        ) from None
    summary, described = parse_docstring(inspect.getdoc(fn) or "")
    props: Schema = {}
    required: list[str] = []
    converters: dict[str, Convert] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        where = f"tool {name}, parameter {p.name}"
        hint = hints.get(p.name, Any)
        prop, convert = _describe(hint, where)
        if p.name in described:  # the parameter's own words before its type's
            prop = {**prop, "description": described[p.name]}
        if p.default is p.empty:
            required.append(p.name)
        elif (default := _json_default(p.default)) is not _NO_JSON:
            prop = {**prop, "default": default}
        props[p.name] = prop
        if convert is not None:
            converters[p.name] = convert
    return summary, {"type": "object", "properties": props, "required": required}, converters


# --- docstrings ---------------------------------------------------------------------------

_GOOGLE = re.compile(r"^(?:Args|Arguments|Parameters|Params):\s*$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_SECTION = re.compile(r"^(Returns?|Raises|Yields|Examples?|Notes?|See Also|Attributes):\s*$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's description (without its parameter sections) and each parameter's
    description, from Google, Sphinx or NumPy style."""
    lines = doc.splitlines()
    params: dict[str, str] = {}
    text: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if _GOOGLE.match(stripped) or (
            stripped == "Parameters" and i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        ):
            numpy = stripped == "Parameters"
            i += 2 if numpy else 1
            i = _param_block(lines, i, params, numpy)
            continue
        match = _SPHINX.match(stripped)
        if match:
            desc = [match.group(2)]
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                desc.append(lines[i].strip())
                i += 1
            params[match.group(1)] = " ".join(d for d in desc if d)
            continue
        if stripped.startswith((":return", ":rtype", ":raises")):
            i += 1
            continue
        text.append(line)
        i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(text).strip()), params


def _param_block(lines: list[str], i: int, params: dict[str, str], numpy: bool) -> int:
    """Read ``name (type): description`` (Google) or ``name : type`` + indented description
    (NumPy) entries until the block ends; returns the index after it."""
    current: str | None = None
    base: int | None = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            if numpy and current is None:
                i += 1
                continue
            if i + 1 < len(lines) and lines[i + 1].startswith((" ", "\t")) and not numpy:
                i += 1
                continue
            break
        indent = len(line) - len(line.lstrip())
        underlined = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        if _SECTION.match(line.strip()) or (numpy and underlined):
            break
        if base is None:
            base = indent
        if indent < base:
            break
        if indent == base:
            head, _, rest = line.strip().partition(":")
            current = head.split("(")[0].strip().split()[0] if head.strip() else None
            if current:
                params[current] = "" if numpy else rest.strip()
        elif current:
            params[current] = f"{params[current]} {line.strip()}".strip()
        i += 1
    return i


# --- types ----------------------------------------------------------------------------------

_NO_JSON = object()


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple) and all(_json_default(v) is v for v in value):
        return list(value)
    return _NO_JSON  # not JSON (a dataclass instance…): the schema says nothing about it


def _describe(hint: Any, where: str) -> tuple[Schema, Convert | None]:
    """The JSON schema of a type hint and the converter of its decoded JSON (None: as is)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        schema, convert = _describe(args[0], where)
        text = next((a for a in args[1:] if isinstance(a, str)), None)
        return ({**schema, "description": text} if text else schema), convert
    if hint is Any or hint is inspect.Parameter.empty or hint is object:
        return {}, None
    if hint is None or hint is type(None):
        return {"type": "null"}, None
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}, (float if hint is float else None)
    if origin is Literal:
        return _enum_schema(list(args)), None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([m.value for m in hint]), hint
    if origin in (Union, types.UnionType):
        return _union(args, where)
    if hint in (list, tuple, set, frozenset) or origin in (list, set, frozenset, Sequence):
        item, convert = _describe(args[0] if args else Any, where)
        container = origin or hint  # a set takes a list with repeats too, and drops them
        schema = {"type": "array", "items": item}
        return schema, _each(convert, container if container in (set, frozenset) else list)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item, convert = _describe(args[0], where)
            return {"type": "array", "items": item}, _each(convert, tuple)
        parts = [_describe(a, where) for a in args]
        n = len(parts)
        schema = {"type": "array", "prefixItems": [s for s, _ in parts], "minItems": n}
        schema["maxItems"] = n
        converts = [c for _, c in parts]
        return schema, lambda v: tuple(c(x) if c else x for c, x in zip(converts, v, strict=False))
    if hint is dict or origin in (dict, Mapping):
        if args and args[0] is not str:
            raise ToolTypeError(f"{where}: JSON object keys are strings, not {args[0]!r}")
        value, convert = _describe(args[1] if args else Any, where)
        schema = {"type": "object", "additionalProperties": value} if value else {"type": "object"}
        return schema, (lambda v: {k: convert(x) for k, x in v.items()}) if convert else None
    if _is_typeddict(hint):
        return _typeddict(hint, where)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass(hint, where)
    if _is_pydantic(hint):
        return _pydantic(hint), hint.model_validate
    raise ToolTypeError(
        f"{where}: the type {getattr(hint, '__name__', hint)!r} has no JSON form; use str, "
        "int, float, bool, list, dict, Literal, an Enum, a TypedDict, a dataclass or a pydantic "
        "model, or give @tool(parameters=...)"
    )


def _enum_schema(values: list[Any]) -> Schema:
    schema: Schema = {"enum": values}
    kinds = {_SCALARS.get(type(v)) for v in values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), **schema}
    return schema


def _union(args: tuple[Any, ...], where: str) -> tuple[Schema, Convert | None]:
    parts = [_describe(a, where) for a in args]
    schemas = [s for s, _ in parts]
    converts = [(a, c) for a, (_, c) in zip(args, parts, strict=True) if c is not None]
    plain = [s["type"] for s in schemas if set(s) == {"type"} and isinstance(s["type"], str)]
    schema: Schema = {"type": plain} if len(plain) == len(schemas) else {"anyOf": schemas}
    if not converts:
        return schema, None

    def convert(value: Any) -> Any:  # the first member type that takes the value
        if value is None:
            return None
        for _, c in converts:
            try:
                return c(value)
            except (TypeError, ValueError):
                continue
        return value

    return schema, convert


def _each(convert: Convert | None, container: Callable[[Any], Any]) -> Convert | None:
    if convert is None and container is list:
        return None
    return lambda v: container(convert(x) if convert else x for x in v)


def _is_typeddict(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__total__")


def _fields(
    owner: type, hints: dict[str, Any], where: str, required: set[str]
) -> tuple[Schema, dict[str, Convert]]:
    props: Schema = {}
    converters: dict[str, Convert] = {}
    _, described = parse_docstring(inspect.getdoc(owner) or "")
    for name, hint in hints.items():
        schema, convert = _describe(hint, f"{where}.{name}")
        if name in described:
            schema = {**schema, "description": described[name]}
        props[name] = schema
        if convert is not None:
            converters[name] = convert
    schema = {"type": "object", "properties": props, "required": sorted(required)}
    schema["additionalProperties"] = False
    if owner.__doc__ and not owner.__doc__.startswith(f"{owner.__name__}("):  # not generated
        summary, _ = parse_docstring(inspect.getdoc(owner) or "")
        if summary:
            schema["description"] = summary
    return schema, converters


def _typeddict(hint: type, where: str) -> tuple[Schema, Convert | None]:
    hints = typing.get_type_hints(hint, include_extras=True)
    # the markers themselves, not __required_keys__: under `from __future__ import annotations`
    # Python before 3.14 counts a NotRequired key as required there
    required = {
        k
        for k, v in hints.items()
        if get_origin(v) is typing.Required
        or (get_origin(v) is not typing.NotRequired and k in hint.__required_keys__)  # type: ignore[attr-defined]
    }
    hints = {k: _strip_required(v) for k, v in hints.items()}
    schema, converters = _fields(hint, hints, where, required)
    if not converters:
        return schema, None
    return schema, lambda v: {k: converters[k](x) if k in converters else x for k, x in v.items()}


def _strip_required(hint: Any) -> Any:
    """``Required[X]`` / ``NotRequired[X]`` of a TypedDict key: ``X`` (the keys say which)."""
    if get_origin(hint) in (typing.Required, typing.NotRequired):
        return get_args(hint)[0]
    return hint


def _dataclass(hint: type, where: str) -> tuple[Schema, Convert]:
    hints = typing.get_type_hints(hint, include_extras=True)
    fields = [f for f in dataclasses.fields(hint) if f.init]
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    schema, converters = _fields(hint, {f.name: hints[f.name] for f in fields}, where, required)
    for f in fields:
        if f.default is not dataclasses.MISSING:
            default = _json_default(f.default)
            if default is not _NO_JSON:
                schema["properties"][f.name]["default"] = default

    def convert(value: Any) -> Any:
        if isinstance(value, hint):
            return value
        return hint(**{k: converters[k](x) if k in converters else x for k, x in value.items()})

    return schema, convert


def _is_pydantic(hint: Any) -> bool:
    return isinstance(hint, type) and all(
        callable(getattr(hint, m, None)) for m in ("model_json_schema", "model_validate")
    )


def _pydantic(model: Any) -> Schema:
    """The model's own JSON schema with its ``$defs`` put in place (a tool's schema has one
    root; recursive models keep a ``$ref`` to their root)."""
    schema: Schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                key = ref.removeprefix("#/$defs/")
                if key in seen or key not in defs:
                    return {"type": "object"}  # recursion: described once, open below
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**inline(defs[key], (*seen, key)), **rest}
            return {k: inline(v, seen) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v, seen) for v in node]
        return node

    out: Schema = inline(schema, ())
    out.pop("title", None)
    return out


def converter(converters: dict[str, Convert]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Turns a tool call's decoded arguments into the types of the function's parameters."""

    def convert(args: dict[str, Any]) -> dict[str, Any]:
        return {
            k: converters[k](v) if k in converters and v is not None else v for k, v in args.items()
        }

    return convert
