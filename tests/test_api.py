"""The stable plugin API (issue #28): ``agentik.api`` has every documented name, the docs and
the examples import only from it, and a plugin can require a version of it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentik.api as api
from agentik.core.template import MODULE, TEST

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"


def documented() -> list[str]:
    return re.findall(r"^- `(\w+)` — ", DOC.read_text(), re.M)


def test_every_documented_name_is_there_and_every_name_is_documented():
    names = documented()
    assert len(names) == len(set(names)), "a name is listed twice in docs/api.md"
    assert sorted(names) == sorted(api.__all__)
    for name in names:
        assert getattr(api, name) is not None, name
    star: dict[str, object] = {}
    exec("from agentik.api import *", star)
    assert set(api.__all__) <= set(star)


def test_the_type_checking_imports_match_the_lazy_table():
    """What type checkers see is what runs: the TYPE_CHECKING block and ``_WHERE`` agree."""
    tree = ast.parse(Path(api.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    )
    seen = {
        alias.name: stmt.module
        for stmt in block.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert seen == api._WHERE


def test_an_unknown_name_says_where_the_public_ones_are():
    with pytest.raises(AttributeError, match=r"agentik.api has no 'ChatStore'.*docs/api.md"):
        api.ChatStore  # noqa: B018


def test_a_plugin_module_importing_the_api_stays_light():
    code = (
        "import sys; from agentik.api import Setting, hookimpl, tool, SettingPrefix;"
        "heavy = [m for m in ('aiohttp', 'peewee', 'agentik.core.app', 'pydantic')"
        " if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("wanted", "ok"), [("1.0", True), ("1", True), ("1.1", False), ("2.0", False), ("0.9", False)]
)
def test_require_api(wanted, ok, monkeypatch):
    monkeypatch.setattr(api, "API_VERSION", "1.0")
    if ok:
        api.require_api(wanted)
        return
    with pytest.raises(api.APIVersionError) as e:
        api.require_api(wanted)
    message = str(e.value)
    assert f"needs the agentik plugin API {wanted}, but agentik-runtime" in message
    assert "has API 1.0" in message
    advice = "upgrade agentik-runtime" if wanted > "1.0" else "use an older agentik-runtime"
    assert message.endswith(advice)
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        api.require_api("one")


# `agentik` and its modules; not other distributions' modules (agentik_dice, agentik_skills)
NAME = r"(agentik(?:\.[\w.]+)?)(?!\w)"
IMPORT = re.compile(rf"^\s*(?:from\s+{NAME}\s+import|import\s+{NAME})", re.M)
ALLOWED = ("agentik.api", "agentik.client")  # the client is a public module of its own


def python_of_docs() -> list[tuple[str, str]]:
    blocks = []
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for code in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S):
            blocks.append((doc.name, code))
    return blocks


def test_docs_and_examples_import_only_the_api():
    sources = python_of_docs()
    sources += [
        (str(p.relative_to(ROOT)), p.read_text())
        for p in ROOT.glob("examples/**/*.py")
        if "build" not in p.relative_to(ROOT).parts  # what an install in place left there
    ]
    sources += [("the template's module", MODULE), ("the template's test", TEST)]
    assert len(sources) > 20
    bad = [
        (where, module)
        for where, code in sources
        for found in IMPORT.findall(code)
        for module in found
        if module and not module.startswith(ALLOWED)
    ]
    assert bad == [], "import from agentik.api (docs/api.md), not from these"
