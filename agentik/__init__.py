"""agentik: a self-hosted runtime for one stateful chat agent, built from pluggy plugins.

Import-light on purpose: plugins write ``from agentik import hookimpl`` and nothing
heavy is pulled in.
"""

from agentik.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
