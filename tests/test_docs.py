"""The docs a user reads stay true: the README's configuration table and the two commands."""

from __future__ import annotations

import re
from pathlib import Path

from agentik.core.cli import settings_table

ROOT = Path(__file__).resolve().parent.parent


def test_readme_configuration_table_matches_the_declared_settings():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- settings:start -->\n(.*?)\n<!-- settings:end -->", readme, re.S)
    assert block, "README.md lacks the settings markers"
    assert block.group(1) == settings_table(), (
        "README configuration table is stale: paste the output of "
        "`agentik plugins --settings-table` between the settings markers"
    )


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make serve" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_docs_link_to_files_that_exist():
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (fenced code left out)."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_docs_link_to_sections_that_exist():
    """Issue #28 (12): a link to writing_plugins.md#an-llm-backend led nowhere."""
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target, anchor in re.findall(r"\]\(([^)#:]*)#([^)]+)\)", doc.read_text()):
            linked = (doc.parent / target) if target else doc
            if linked.suffix == ".md":
                assert anchor in anchors(linked), f"{doc.name} links to missing {target}#{anchor}"
