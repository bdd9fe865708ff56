"""agentik-tools-units: a typed tool and the prompt section that tells the model about it.

The tool's JSON schema comes from its type hints (an ``Enum``, a dataclass, a ``Literal``) and
its docstring; the model's arguments reach the function as those types.
"""

import enum
from dataclasses import dataclass
from typing import Literal

from agentik.api import Setting, hookimpl, parse_choice, tool


class Unit(enum.Enum):
    METRE = "m"
    KILOMETRE = "km"
    FOOT = "ft"
    MILE = "mi"


METRES = {Unit.METRE: 1.0, Unit.KILOMETRE: 1000.0, Unit.FOOT: 0.3048, Unit.MILE: 1609.344}


@dataclass
class Length:
    """A length: a number and its unit."""

    value: float
    unit: Unit


@tool
def convert_length(length: Length, to: Unit, digits: Literal[0, 1, 2, 3] = 2) -> str:
    """Convert a length to another unit.

    Args:
        length: The length to convert.
        to: The unit to convert it to.
        digits: Decimal places in the answer.
    """
    value = round(length.value * METRES[length.unit] / METRES[to], digits)
    return f"{value} {to.value}"


@hookimpl
def register_settings(register):
    register(
        Setting("UNITS_SYSTEM", "metric", parse_choice("metric", "imperial"), "Units to answer in.")
    )


@hookimpl
def register_tools(register):
    register(convert_length)


@hookimpl
def register_prompt_sections(register, settings):
    system = settings["UNITS_SYSTEM"]
    text = (
        f"Lengths: answer in {system} units; for any conversion call convert_length "
        f"(units: {', '.join(u.value for u in Unit)}) instead of computing it yourself."
    )
    register("units", lambda: text, order=200)
