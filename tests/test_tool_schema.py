"""Tools from type hints (issue #28): the schema a model sees, and the values the function gets.

Before, anything but a scalar became ``"string"``: a model passing a correct list was refused.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Annotated, Literal, NotRequired, TypedDict

import jsonschema
import pydantic
import pytest

from agentik.api import ToolCallRequest, run_turn, tool
from agentik.core.tool_schema import ToolTypeError, parse_docstring
from agentik.core.tools import ToolRegistry


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(TypedDict):
    """Where someone lives."""

    street: str
    zip: NotRequired[int]


@dataclasses.dataclass
class Point:
    """A point on the canvas."""

    x: float
    y: float = 0.0


class Coords(pydantic.BaseModel):
    lat: float
    lon: float


class Place(pydantic.BaseModel):
    name: str
    coords: Coords | None = None


@tool
def paint(
    colors: list[Color],
    where: Point,
    mode: Literal["fast", "slow"] = "fast",
    note: str | None = None,
    address: Address | None = None,
    place: Place | None = None,
    tags: set[str] | None = None,
    layers: Annotated[int, "how many coats"] = 1,
    size: tuple[int, int] = (1, 1),
    weights: dict[str, float] | None = None,
) -> dict:
    """Paint something.

    Args:
        colors: The colours to use,
            in order.
        where (Point): Where to paint.
        mode: How fast.

    Returns:
        what was painted
    """
    return {
        "colors": colors,
        "where": where,
        "mode": mode,
        "note": note,
        "address": address,
        "place": place,
        "tags": tags,
        "layers": layers,
        "size": size,
        "weights": weights,
    }


PARAMS = paint.spec.parameters


def test_the_schema_of_every_kind_of_hint():
    props = PARAMS["properties"]
    assert PARAMS["required"] == ["colors", "where"]
    assert props["colors"] == {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "blue"]},
        "description": "The colours to use, in order.",
    }
    assert props["where"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number", "default": 0.0}},
        "required": ["x"],
        "additionalProperties": False,
        "description": "Where to paint.",  # the parameter's words, before its type's
    }
    assert props["mode"] == {
        "type": "string",
        "enum": ["fast", "slow"],
        "description": "How fast.",
        "default": "fast",
    }
    assert props["note"] == {"type": ["string", "null"], "default": None}
    address = props["address"]["anyOf"][0]
    assert address["required"] == ["street"]  # NotRequired, even as a string annotation
    assert address["properties"]["zip"] == {"type": "integer"}
    place = props["place"]["anyOf"][0]  # pydantic's own schema, its $defs put in place
    assert "$defs" not in json.dumps(PARAMS)
    assert place["properties"]["coords"]["anyOf"][0]["required"] == ["lat", "lon"]
    assert props["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert props["layers"] == {"type": "integer", "description": "how many coats", "default": 1}
    assert props["size"]["prefixItems"] == [{"type": "integer"}, {"type": "integer"}]
    assert props["size"]["default"] == [1, 1]
    assert props["weights"]["anyOf"][0] == {
        "type": "object",
        "additionalProperties": {"type": "number"},
    }
    # the description is the docstring without its parameter section
    assert paint.spec.description == "Paint something.\n\nReturns:\n    what was painted"
    jsonschema.Draft202012Validator.check_schema(PARAMS)


async def test_a_correct_call_is_accepted_and_the_function_gets_python_values():
    registry = ToolRegistry([paint])
    args = {
        "colors": ["red", "blue"],
        "where": {"x": 1},
        "address": {"street": "Main St"},
        "place": {"name": "home", "coords": {"lat": 1.5, "lon": 2}},
        "tags": ["a", "b", "a"],
        "size": [2, 3],
        "weights": {"a": 1},
    }
    captured = {}

    @tool
    def spy(
        colors: list[Color],
        where: Point,
        address: Address | None = None,
        place: Place | None = None,
        tags: set[str] | None = None,
        size: tuple[int, int] = (1, 1),
        weights: dict[str, float] | None = None,
    ) -> str:
        """Record what it gets."""
        captured.update(locals())
        return "ok"

    registry.add(spy)
    assert await registry.invoke("spy", json.dumps(args)) == ("ok", False)
    assert captured["colors"] == [Color.RED, Color.BLUE]
    assert captured["where"] == Point(1.0, 0.0) and isinstance(captured["where"].x, float)
    assert captured["address"] == {"street": "Main St"}
    assert captured["place"] == Place(name="home", coords=Coords(lat=1.5, lon=2.0))
    assert captured["tags"] == {"a", "b"}
    assert captured["size"] == (2, 3)
    assert captured["weights"] == {"a": 1.0}
    text, error = await registry.invoke("paint", json.dumps({"colors": [], "where": {"x": 0}}))
    assert not error and json.loads(text)["mode"] == "fast"


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"colors": ["green"], "where": {"x": 1}}, "colors/0: 'green' is not one of"),
        ({"colors": [], "where": {"x": 1, "z": 2}}, "Additional properties are not allowed"),
        ({"colors": [], "where": {"x": 1}, "mode": "medium"}, "'medium' is not one of"),
        ({"colors": "red", "where": {"x": 1}}, "'red' is not of type 'array'"),
        ({"colors": [], "where": {"x": 1}, "size": [1]}, "size: [1] is too short"),
    ],
)
async def test_a_wrong_call_says_what_is_wrong(args, problem):
    text, error = await ToolRegistry([paint]).invoke("paint", json.dumps(args))
    assert error and problem in text, text


def test_the_three_docstring_styles():
    google = (
        "Roll dice.\n\nArgs:\n    sides (int): Sides per die.\n    count: How many\n        dice."
    )
    sphinx = "Roll dice.\n\n:param int sides: Sides per die.\n:param count: How many\n    dice.\n"
    numpy = (
        "Roll dice.\n\nParameters\n----------\nsides : int\n    Sides per die.\ncount : int\n"
        "    How many\n    dice.\n\nReturns\n-------\nint\n    The sum."
    )
    for doc in (google, sphinx, numpy):
        summary, params = parse_docstring(doc)
        assert params == {"sides": "Sides per die.", "count": "How many dice."}, doc
        assert summary.startswith("Roll dice.") and "sides" not in summary


class Opaque:
    pass


def test_a_type_without_a_json_form_is_refused_naming_tool_and_parameter():
    def upload(blob: Opaque) -> str:
        return ""

    with pytest.raises(ToolTypeError, match="tool upload, parameter blob: the type 'Opaque'"):
        tool(upload)

    class Local:  # a string annotation (this module's __future__ import) cannot see it
        pass

    def keep(item: Local) -> str:
        return ""

    with pytest.raises(ToolTypeError, match="tool keep: an annotation cannot be resolved"):
        tool(keep)
    with pytest.raises(ToolTypeError, match="keys are strings"):

        @tool
        def counts(by_id: dict[int, str]) -> str:
            return ""


def test_an_explicit_schema_is_kept_as_given():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    @tool(parameters=schema, description="Search.")
    def search(**kwargs) -> str:
        return ""

    assert search.spec.parameters is schema and search.spec.description == "Search."


async def test_a_typed_tool_in_a_turn(agentik_agent, scripted_llm):
    class Plugin:
        from agentik.api import hookimpl

        @hookimpl
        def register_tools(self, register):
            register(paint)

    call = json.dumps({"colors": ["blue"], "where": {"x": 2, "y": 3}, "tags": ["x"]})
    scripted_llm.steps = [[ToolCallRequest("c1", "paint", call)], ["Painted."]]
    agent = await agentik_agent(plugins=[("painter", Plugin())])
    turn = await run_turn(agent, "paint it blue")
    result = next(e for e in turn.events if e.type == "ToolResult")
    assert not result.is_error
    assert json.loads(result.text)["colors"] == ["Color.BLUE"]  # what the function got
    assert turn.text == "Painted."
