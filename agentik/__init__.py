"""agentik: a self-hosted runtime for one stateful chat agent, built from pluggy plugins.

Import-light on purpose: plugins write ``from agentik.api import hookimpl`` (or
``from agentik import hookimpl``) and nothing heavy is pulled in. What plugins may use is
``agentik.api`` (docs/api.md); ``agentik.core`` is private.
"""

from agentik.hookspecs import hookimpl

__version__ = "0.1.0"
#: the name on PyPI (`agentik` there is an unrelated project); the import name stays `agentik`
DISTRIBUTION = "agentik-runtime"
__all__ = ["DISTRIBUTION", "__version__", "hookimpl"]
