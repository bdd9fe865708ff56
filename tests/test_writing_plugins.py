"""docs/writing_plugins.md cannot rot: its steps run in order, as a reader would run them, in a
throwaway venv (agentik comes from this environment; the tutorial's package is installed
for real). Blocks after ``<!-- not run: … -->`` (installs and uploads) are left out; a ``text``
block is the output the command before it must print (numbers may differ: dice are random)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.test_plugins import throwaway_venv

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing_plugins.md"
BLOCK = re.compile(r"(<!-- not run:[^>]*-->\n)?```(\w+)\n(.*?)^```", re.S | re.M)


def guide_blocks() -> list[tuple[str, str, bool]]:
    """(language, code, runs) for every fenced block of the guide, in order."""
    return [(lang, code, not skip) for skip, lang, code in BLOCK.findall(GUIDE.read_text())]


def venv_with_agentik(tmp_path: Path) -> Path:
    venv, _ = throwaway_venv(tmp_path)
    py = venv / "bin" / "python"
    # what installing agentik-runtime puts on PATH; pip works offline on what is here
    (venv / "bin" / "agentik").write_text(f'#!/bin/sh\nexec {py} -m agentik "$@"\n')
    (venv / "bin" / "pip").write_text(
        f'#!/bin/sh\nexec {py} -m pip "$@" -q --no-deps --no-build-isolation\n'
    )
    for name in ("agentik", "pip"):
        (venv / "bin" / name).chmod(0o755)
    return venv


def matches(expected: str, output: str) -> bool:
    """Every expected line appears in the output, in order; numbers may differ."""
    lines = output.splitlines()
    at = 0
    for want in expected.strip().splitlines():
        pattern = re.compile(re.sub(r"\\d\\+|\d+", r"\\d+", re.escape(want.rstrip())) + r"\s*$")
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        if at == len(lines):
            return False
        at += 1
    return True


def test_the_guide_is_a_tutorial_that_runs(tmp_path):
    blocks = guide_blocks()
    assert any(lang == "python" and code.startswith("# file: tests/") for lang, code, _ in blocks)
    venv = venv_with_agentik(tmp_path)
    project = tmp_path / "agentik-dice"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    home = tmp_path / "home"  # the reader's home: the tutorial must not write into it
    home.mkdir()
    env["HOME"] = str(home)
    env.pop("VIRTUAL_ENV", None)
    output = ""
    ran = 0
    for lang, code, runs in blocks:
        header = re.match(r"# file: (\S+)\n", code)
        if header and runs:
            path = project / header.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code)
        elif lang == "sh" and runs:
            result = subprocess.run(
                ["bash", "-e", "-c", code],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"this step failed:\n{code}\n{output}"
            assert "Traceback" not in output, f"{code}\n{output}"
            ran += 1
        elif lang == "text":
            assert matches(code, output), f"expected\n{code}\nin the output\n{output}"
    assert ran >= 4
    # the last step installed the package for real: the entry point is what agentik loads
    assert (project / "setup.cfg").exists()
    # issue #28: the in-memory try-out wrote notes into the reader's real ~/.agentik/memory
    assert not (home / ".agentik").exists()
