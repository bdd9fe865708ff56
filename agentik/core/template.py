"""``agentik plugins new NAME``: a plugin distribution to start from, ready to install and test.

It writes ``agentik-NAME/``: a ``pyproject.toml`` (the ``agentik`` entry point, a dependency on
agentik-runtime), ``agentik_NAME.py`` with a setting and a tool, a test written with agentik's
pytest fixtures, a README and a GitHub Actions workflow running the tests.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentik import DISTRIBUTION

NAME = re.compile(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "An agentik plugin: {words}"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["{runtime}>={api_from}"]

[project.optional-dependencies]
test = ["pytest>=8", "pytest-asyncio>=0.23"]

# how agentik finds the plugin: the entry point's name is the module's (unique among plugins)
[project.entry-points.agentik]
{module} = "{module}"

[tool.setuptools]
py-modules = ["{module}"]

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
"""

MODULE = '''\
"""{dist}: an agentik plugin. It declares a setting and gives the model a tool.

Everything it uses comes from ``agentik.api``, agentik's stable plugin API (docs/api.md).
"""

from agentik.api import Setting, SettingPrefix, hookimpl, require_api, tool

require_api("{api}")  # a clear load error on an agentik without this API

PREFIX = "{prefix}"


@hookimpl
def register_settings(register):
    register(Setting(f"{{PREFIX}}GREETING", "Hello", str, "How the greet tool says hello."))
    register(SettingPrefix(PREFIX))  # a typo in a {prefix}* variable gets a warning


@hookimpl
def register_tools(register, settings):
    greeting = settings[f"{{PREFIX}}GREETING"]

    @tool
    def greet(name: str, excited: bool = False) -> str:
        """Greet someone by name.

        Args:
            name: Who to greet.
            excited: End with an exclamation mark.
        """
        return f"{{greeting}}, {{name}}{{'!' if excited else '.'}}"

    register(greet)
'''

TEST = '''\
"""Tests of {dist}, with agentik's pytest fixtures: ``agentik_agent`` starts an agent with the
plugins you give it, ``scripted_llm`` plays the model."""

import {module}

from agentik.api import ToolCallRequest, run_turn

PLUGIN = [("{module}", {module})]


async def test_the_model_calls_greet(agentik_agent, scripted_llm):
    scripted_llm.steps = [
        [ToolCallRequest("c1", "greet", '{{"name": "Ada", "excited": true}}')],
        ["Done."],
    ]
    agent = await agentik_agent(plugins=PLUGIN, env={{"{prefix}GREETING": "Hi"}})
    turn = await run_turn(agent, "say hi to Ada")
    result = next(e for e in turn.events if e.type == "ToolResult")
    assert result.text == "Hi, Ada!"
    assert turn.text == "Done."


async def test_bad_arguments_never_reach_the_tool(agentik_agent, scripted_llm):
    scripted_llm.steps = [[ToolCallRequest("c1", "greet", '{{"name": 3}}')], ["Sorry."]]
    agent = await agentik_agent(plugins=PLUGIN)
    turn = await run_turn(agent, "greet 3")
    result = next(e for e in turn.events if e.type == "ToolResult")
    assert result.is_error and "3 is not of type 'string'" in result.text
'''

README = """\
# {dist}

An agentik plugin ({runtime}): a `greet` tool, configured by `{prefix}GREETING`.

## Develop

```sh
python3 -m venv .venv && . .venv/bin/activate
pip install -e '.[test]'      # agentik-runtime with it{runtime_note}
agentik plugins | grep -A3 '^{module}'
agentik serve --reload        # restarts when you save {module}.py
python -m pytest -q
```

Adding or renaming an entry point needs `pip install -e .` again. What a plugin may import is
`agentik.api` (agentik's docs/api.md); the hooks are in its docs/plugin_hooks.md.

## Publish

```sh
pip install build twine && python -m build && twine upload dist/*
```
"""

WORKFLOW = """\
name: test
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python: ["3.11", "3.12"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{{{ matrix.python }}}}
      # AGENTIK_RUNTIME: where agentik comes from, a pip requirement (set it to
      # 'agentik-runtime @ git+https://…' to test against a checkout)
      - run: pip install "${{AGENTIK_RUNTIME:-{runtime}}}" && pip install -e '.[test]'
        env:
          AGENTIK_RUNTIME: ${{{{ vars.AGENTIK_RUNTIME }}}}
      - run: python -m pytest -q
"""

GITIGNORE = "__pycache__/\n*.egg-info/\nbuild/\ndist/\n.venv/\n"


def names(name: str) -> tuple[str, str]:
    """``(distribution, module)`` for a plugin called ``name`` (``heartbeat`` or
    ``agentik-heartbeat``): ``agentik-heartbeat``, ``agentik_heartbeat``."""
    base = name.strip().lower().removeprefix("agentik-").removeprefix("agentik_")
    if not NAME.match(base):
        raise ValueError(
            f"{name!r} is not a plugin name: lower-case letters, digits and '-', e.g. heartbeat"
        )
    return f"agentik-{base.replace('_', '-')}", f"agentik_{base.replace('-', '_')}"


def new_plugin(name: str, parent: Path) -> Path:
    """Write the distribution ``agentik-NAME`` under ``parent``; returns its folder. Refuses a
    folder that exists (nothing is overwritten)."""
    from agentik.api import API_VERSION

    dist, module = names(name)
    folder = parent / dist
    if folder.exists():
        raise FileExistsError(f"{folder} exists already; nothing was written")
    words = dist.removeprefix("agentik-").replace("-", " ")
    values = {
        "dist": dist,
        "module": module,
        "words": words,
        "prefix": module.removeprefix("agentik_").upper() + "_",
        "runtime": DISTRIBUTION,
        "api": API_VERSION,
        "api_from": "0.1",
        "runtime_note": (
            f" (until {DISTRIBUTION} is on PyPI: first `pip install -e /path/to/agentik`)"
        ),
    }
    files = {
        "pyproject.toml": PYPROJECT,
        f"{module}.py": MODULE,
        f"tests/test_{module}.py": TEST,
        "README.md": README,
        ".github/workflows/test.yml": WORKFLOW,
        ".gitignore": GITIGNORE,
    }
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.format(**values))
    return folder
