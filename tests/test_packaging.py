"""What a plain ``pip install`` (not editable) ships: every package of the source tree."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_the_tree_is_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    mapped = {
        name.strip(): path.strip()
        for name, _, path in (
            line.partition("=") for line in cfg["options"]["package_dir"].strip().splitlines()
        )
    }
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "agentik").rglob("__init__.py")
    }
    for name, path in mapped.items():
        found |= {
            ".".join([name, *init.parent.relative_to(ROOT / path).parts])
            for init in (ROOT / path).rglob("__init__.py")
        }
    assert found - listed == set(), "packages missing from setup.cfg [options] packages"
