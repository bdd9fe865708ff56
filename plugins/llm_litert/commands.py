"""``agentik models pull [REPO [FILE]]`` and ``agentik models list``: the litert model cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentik.core.settings import Settings, SettingsError
from agentik_llm_litert import models


def setup(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    pull = actions.add_parser(
        "pull",
        help="download a model into the cache (default: AGENTIK_GOOGLE_MODEL_REPO/FILE)",
    )
    pull.add_argument("repo", nargs="?", type=_checked(models.parse_repo), help="hub repository")
    pull.add_argument("file", nargs="?", type=_checked(models.parse_file), help=".litertlm file")
    actions.add_parser("list", help="the cached models and their sizes")


def _checked(parse: object) -> object:
    def check(raw: str) -> str:
        try:
            return parse(raw)  # type: ignore[operator, no-any-return]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{raw!r} {e}") from None

    return check


def run(args: argparse.Namespace, settings: Settings) -> int:
    root = models.models_dir(settings)
    if args.action == "list":
        return list_models(root, models.wanted(settings))
    repo, file = models.wanted(settings)
    if args.repo is not None and args.repo != repo:
        if args.file is None:
            raise SettingsError(f"name the file too: agentik models pull {args.repo} FILE")
        repo, file = args.repo, args.file
    elif args.file is not None:
        file = args.file
    model = models.cached(root, repo, file)
    if model is not None:
        print(f"{repo}/{file} is cached already: {model.path} ({models.human(model.size)})")
    else:
        model = models.fetch(root, repo, file)
        print(f"{repo}/{file}: {model.path} ({models.human(model.size)})")
    if (repo, file) != models.wanted(settings):
        print(f"use it with AGENTIK_GOOGLE_MODEL_REPO={repo} AGENTIK_GOOGLE_MODEL_FILE={file}")
    return 0


def list_models(root: Path, chosen: tuple[str, str]) -> int:
    found = list(models.list_cached(root))
    for m in found:
        mark = "  (chosen)" if (m.repo, m.file) == chosen else ""
        print(f"{models.human(m.size):>8}  {m.repo}/{m.file}  {m.path}{mark}")
    kept = models.partial_size(root, *chosen)
    if kept:
        print(f"{models.human(kept):>8}  {chosen[0]}/{chosen[1]}  (partial: the next pull resumes)")
    if not found and not kept:
        print(f"no models in {root}")
    return 0
