"""Tool arguments are checked against the tool's JSON schema (issue #12, defect 12)."""

from __future__ import annotations

import itertools

import jsonschema
import pytest

from agentik.core.tools import ToolRegistry, _flat_check, tool

FLAT = {
    "type": "object",
    "properties": {
        "sides": {"type": "integer"},
        "label": {"type": "string", "description": "shown"},
        "weight": {"type": "number"},
        "loaded": {"type": "boolean"},
        "faces": {"type": "array"},
        "meta": {"type": "object"},
        "none": {"type": "null"},
    },
    "required": ["sides"],
}
VALUES = [0, 6, -1, 6.0, 6.5, True, False, "six", "", None, [], [1], {}, {"a": 1}]


def test_the_fast_path_agrees_with_jsonschema_on_every_value():
    quick = _flat_check(FLAT)
    assert quick is not None
    validator = jsonschema.Draft202012Validator(FLAT)
    for name, value in itertools.product(FLAT["properties"], VALUES):
        for args in ({name: value}, {"sides": 3, name: value}, {"other": 1, name: value}):
            assert quick(args) == validator.is_valid(args), args


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}},
        {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
        {"type": "object", "additionalProperties": False},
        {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {}}},
    ],
)
def test_other_schemas_always_go_through_jsonschema(schema):
    assert _flat_check(schema) is None


async def test_a_tool_never_sees_arguments_its_schema_refuses():
    seen = []

    @tool(parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})
    def pick(n: int = 1) -> str:
        seen.append(n)
        return str(n)

    @tool
    def roll(sides: int) -> str:
        """Roll."""
        seen.append(sides)
        return str(sides)

    tools = ToolRegistry([pick, roll])
    assert await tools.invoke("pick", '{"n": 0}') == (
        "Error: invalid arguments for pick: n: 0 is less than the minimum of 1",
        True,
    )
    assert await tools.invoke("roll", '{"sides": "six"}') == (
        "Error: invalid arguments for roll: sides: 'six' is not of type 'integer'",
        True,
    )
    assert await tools.invoke("roll", "{}") == (
        "Error: invalid arguments for roll: 'sides' is a required property",
        True,
    )
    assert await tools.invoke("roll", '{"sides": 6}') == ("6", False)
    assert await tools.invoke("pick", '{"n": 2}') == ("2", False)
    assert seen == [6, 2]
