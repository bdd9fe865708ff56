"""Idle RSS of a bare ``agentik serve`` of this tree against the same server at a git ref, the
two started in alternation (B4's environment: memory, reflection and titles off).

    python bench/tools/ab_idle_rss.py --base HEAD~1 --servers 5

Each server's ``VmRSS`` is read ``--settle`` seconds after ``/health`` answers, then it is
stopped. The ref's tree is exported and loaded through ``PYTHONPATH`` as ``ab_server.py`` does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from ab_server import export


def idle_rss_mib(fake: common.Proc, settle: float, **extra: str) -> float:
    server = common.start_agentik(fake.port, **extra)
    try:
        time.sleep(settle)
        return common.rss_kib(server.pid) / 1024
    finally:
        common.stop_all(server)


def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ab-rss-"))
    path = export(args.base, tmp)
    fake = common.start_fake()
    rss: dict[str, list[float]] = {"new": [], "base": []}
    try:
        for _ in range(args.servers):
            rss["base"].append(round(idle_rss_mib(fake, args.settle, PYTHONPATH=path), 2))
            rss["new"].append(round(idle_rss_mib(fake, args.settle), 2))
    finally:
        common.stop_all(fake)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"base": args.base, "idle_rss_mib": rss}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after /health")
    print(json.dumps(main(parser.parse_args()), indent=1))
