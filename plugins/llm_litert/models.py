"""The litert backend's model cache: a ``.litertlm`` file fetched once from the Hugging Face hub.

Layout under ``AGENTIK_MODELS_DIR``: ``<org>/<name>/<file>`` holds only verified models, each
with ``<file>.json`` beside it (repo, revision, etag, size), written after the checks; a use
of the cache is a ``stat`` and that small read, no request. A download goes to
``.partial/<org>/<name>/<file>.<etag>.part`` and is resumed from there by a later run (the
hub's ``Range`` support); it is moved in place only once its size, its sha256 (the etag of a
hub LFS file) and its LiteRT-LM header are checked, so a half-written or corrupt file is never
loaded. ``huggingface_hub`` (the ``litert`` extra) is imported only when a fetch is needed; it
brings ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``, proxies and retries.

``hf_hub_download`` is not used: since huggingface_hub 1.x it deletes its partial file when a
download fails, so a download cut by Ctrl-C or a lost network would start over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentik.core.settings import Settings, SettingsError

log = logging.getLogger(__name__)

DEFAULT_REPO = "litert-community/Qwen3-0.6B"
DEFAULT_FILE = "Qwen3-0.6B.litertlm"
DEFAULT_SIZE = "586 MB"  # shown before the hub tells the real size
MAGIC = b"LITERTLM"
PARTIAL = ".partial"
RETRIES, RETRY_WAIT = 5, 1.0  # a dropped connection, within one run
SKIP = (
    "to skip the download set OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL (an endpoint) "
    "or AGENTIK_GOOGLE_MODEL_PATH (a .litertlm file you have)"
)


class FetchError(SettingsError):
    """The model cannot be fetched or used; one line that says what to do."""


@dataclass(frozen=True)
class CachedModel:
    repo: str
    file: str
    path: Path
    size: int
    revision: str | None


def default_models_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentik" / "models"


def models_dir(settings: Settings) -> Path:
    return settings.get("AGENTIK_MODELS_DIR") or default_models_dir()


def wanted(settings: Settings) -> tuple[str, str]:
    """The repo and file the settings choose."""
    return settings["AGENTIK_GOOGLE_MODEL_REPO"], settings["AGENTIK_GOOGLE_MODEL_FILE"]


def parse_repo(raw: str) -> str:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", raw) or ".." in raw:
        raise ValueError("must be a hub repository id, e.g. litert-community/Qwen3-0.6B")
    return raw


def parse_file(raw: str) -> str:
    parts = raw.split("/")
    if any(p in ("", ".", "..") for p in parts) or raw.startswith("/"):
        raise ValueError("must be a file path inside the repository, e.g. Qwen3-0.6B.litertlm")
    return raw


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def cached(root: Path, repo: str, file: str) -> CachedModel | None:
    """The verified model in the cache, or None; no request is made. A file whose size is not
    the one recorded at its verification is left unused (and reported)."""
    path = root / repo / file
    try:
        meta = json.loads(_sidecar(path).read_text())
        size = path.stat().st_size
    except (OSError, ValueError):
        return None
    if size != meta.get("size"):
        log.warning(
            "%s is %d bytes, not the %s it was: fetching it again", path, size, meta["size"]
        )
        return None
    return CachedModel(repo, file, path, size, meta.get("revision"))


def list_cached(root: Path) -> Iterator[CachedModel]:
    """Every verified model under ``root`` (``agentik models list``)."""
    if not root.is_dir():
        return
    for sidecar in sorted(root.rglob("*.json")):
        if PARTIAL in sidecar.relative_to(root).parts:
            continue
        try:
            meta = json.loads(sidecar.read_text())
            repo, file = meta["repo"], meta["file"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        model = cached(root, repo, file)
        if model is not None:
            yield model


def partial_size(root: Path, repo: str, file: str) -> int:
    """Bytes of an interrupted download of ``repo``/``file`` kept for the next run."""
    folder = (root / PARTIAL / repo / file).parent
    name = Path(file).name
    return sum(p.stat().st_size for p in folder.glob(f"{name}.*.part")) if folder.is_dir() else 0


def human(size: int) -> str:
    if size >= 10**9:
        return f"{size / 10**9:.1f} GB"
    if size >= 10**6:
        return f"{size / 10**6:.0f} MB"
    return f"{size / 10**3:.0f} kB" if size >= 10**3 else f"{size} B"


def fetch(root: Path, repo: str, file: str) -> CachedModel:
    """Download ``repo``/``file`` into the cache (resuming a partial download), verify it and
    move it in place. Every failure is a :class:`FetchError`."""
    try:
        with _lock(root, repo, file):  # another process may be fetching it: wait, then use it
            return cached(root, repo, file) or _fetch(root, repo, file)
    except FetchError:
        raise
    except KeyboardInterrupt:
        kept = partial_size(root, repo, file)
        raise FetchError(
            f"the download of {repo}/{file} was interrupted; {human(kept)} are kept in "
            f"{root / PARTIAL} and the next start resumes it"
        ) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FetchError(
                f"the disk is full: {repo}/{file} does not fit in AGENTIK_MODELS_DIR={str(root)!r}"
                f"; free some space or point AGENTIK_MODELS_DIR elsewhere, or {SKIP}"
            ) from e
        raise FetchError(
            f"cannot write the model to AGENTIK_MODELS_DIR={str(root)!r}: {e}; {SKIP}"
        ) from e


def _lock(root: Path, repo: str, file: str) -> Any:
    try:
        from filelock import FileLock  # a dependency of huggingface_hub
    except ImportError:
        return contextlib.nullcontext()  # _fetch says what to install
    path = root / PARTIAL / repo / f"{file}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


def _fetch(root: Path, repo: str, file: str) -> CachedModel:
    try:
        from huggingface_hub import constants, errors, get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers
    except ImportError as e:
        raise FetchError(
            "fetching a model needs huggingface_hub: "
            f"pip install 'agentik-runtime[litert]' ({e}); {SKIP}"
        ) from e
    import httpx2

    where = f"{repo}/{file}"
    endpoint = constants.ENDPOINT
    if not logging.getLogger("httpx2").level:  # a line per request is noise here
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    if constants.is_offline_mode():
        raise FetchError(
            f"HF_HUB_OFFLINE is set and {where} is not in AGENTIK_MODELS_DIR={str(root)!r} "
            f"(`agentik models pull` fetches it where the hub can be reached); {SKIP}"
        )
    url = hf_hub_url(repo, file)
    try:
        meta = get_hf_file_metadata(url)
        if meta.etag is None or meta.commit_hash is None:
            raise errors.FileMetadataError("no ETag or X-Repo-Commit")
        etag, size = meta.etag, meta.size
        part = root / PARTIAL / repo / f"{file}.{_safe(etag)}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        for stale in part.parent.glob(f"{Path(file).name}.*.part"):
            if stale != part:  # a download of an older revision
                stale.unlink()
        have = part.stat().st_size if part.exists() else 0
        if size is not None and have > size:
            part.unlink()
            have = 0
        if have and have == size:
            log.info("%s: already downloaded, checking it", where)
        else:
            log.info(
                "downloading %s (%s) from %s into %s%s",
                where,
                human(size) if size else "size unknown",
                endpoint,
                root,
                f", resuming after {human(have)}" if have else "",
            )
            headers = build_hf_headers()
            headers["Accept-Encoding"] = "identity"
            if urlsplit(meta.location).netloc != urlsplit(url).netloc:
                headers.pop("authorization", None)  # a CDN's signed URL: the token stays home
            download(meta.location, part, size, headers, Path(file).name)
    except errors.GatedRepoError as e:
        raise FetchError(
            f"{repo} is gated on {endpoint}: accept its licence on its page and set HF_TOKEN "
            f"(or choose another model with AGENTIK_GOOGLE_MODEL_REPO); {SKIP}"
        ) from e
    except (errors.RemoteEntryNotFoundError, errors.RevisionNotFoundError) as e:
        raise FetchError(
            f"{endpoint} has no file {file} in {repo} (404): check AGENTIK_GOOGLE_MODEL_FILE; "
            f"{SKIP}"
        ) from e
    except errors.RepositoryNotFoundError as e:
        raise FetchError(
            f"{endpoint} has no repository {repo} that it shows without a token "
            f"({_status(e)}): check AGENTIK_GOOGLE_MODEL_REPO, or set HF_TOKEN if it is private; "
            f"{SKIP}"
        ) from e
    except errors.HfHubHTTPError as e:
        status = _status(e)
        if status in (401, 403):
            raise FetchError(
                f"{endpoint} refused {where} ({status}): the repository is private or gated, or "
                f"HF_TOKEN is wrong; set HF_TOKEN to a token that may read it; {SKIP}"
            ) from e
        raise FetchError(
            f"{endpoint} answered {status} for {where}{_kept(root, repo, file)}; try again later, "
            f"or {SKIP}"
        ) from e
    except errors.FileMetadataError as e:
        raise FetchError(
            f"{endpoint} does not answer like a Hugging Face hub for {where} ({e}); check "
            f"HF_ENDPOINT, or {SKIP}"
        ) from e
    except (httpx2.HTTPError, errors.OfflineModeIsEnabled) as e:
        raise FetchError(
            f"cannot reach the model hub {endpoint} to fetch {where} ({type(e).__name__}: {e})"
            f"{_kept(root, repo, file)}; {SKIP}"
        ) from e
    return _install(root, repo, file, part, meta.commit_hash, etag, size, endpoint)


def download(url: str, part: Path, size: int | None, headers: dict[str, str], name: str) -> None:
    """GET ``url`` into ``part``, asking only for the bytes it lacks (``Range``); a connection
    that drops after some progress is resumed at once, a few times."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status
    from huggingface_hub.utils import tqdm as hub_tqdm

    progress: Any = hub_tqdm if sys.stderr.isatty() else LogProgress
    for attempt in range(RETRIES + 1):
        have = part.stat().st_size if part.exists() else 0
        asked = {**headers, "Range": f"bytes={have}-"} if have else headers
        try:
            with get_session().stream(
                "GET", url, headers=asked, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
            ) as response:
                if have and response.status_code == 416:  # the part is not a prefix of it
                    part.unlink()
                    continue
                hf_raise_for_status(response)
                if have and response.status_code != 206:  # the whole file again
                    have = 0
                with (
                    open(part, "ab" if have else "wb") as out,
                    progress(total=size, initial=have, desc=name, unit="B", unit_scale=True) as bar,
                ):
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        bar.update(len(chunk))
            return
        except (httpx2.TransportError, httpx2.StreamError) as e:
            got = part.stat().st_size if part.exists() else 0  # cut before the first byte
            if attempt == RETRIES or got <= have:  # no progress: give up
                raise
            log.warning("the download of %s was cut (%s): resuming", name, e)
            time.sleep(RETRY_WAIT)


def _install(
    root: Path,
    repo: str,
    file: str,
    part: Path,
    revision: str,
    etag: str,
    size: int | None,
    endpoint: str,
) -> CachedModel:
    """Verify the downloaded ``part``, then move it in place with its sidecar."""
    where = f"{repo}/{file} from {endpoint}"
    got = part.stat().st_size
    problem = None
    if size is not None and got != size:
        problem = f"it is {got} bytes, the hub said {size}"
    elif re.fullmatch(r"[0-9a-f]{64}", etag) and _sha256(part) != etag:
        problem = "its sha256 is not the hub's"
    else:
        problem = header_problem(part)
    if problem is not None:
        part.unlink()
        raise FetchError(
            f"the downloaded {where} is corrupt ({problem}) and was deleted; try again, or {SKIP}"
        )
    final = root / repo / file
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    sidecar = {"repo": repo, "file": file, "revision": revision, "etag": etag, "size": got}
    tmp = _sidecar(final).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(sidecar, indent=1))
    os.replace(tmp, _sidecar(final))
    log.info("%s is verified and cached: %s (%s)", f"{repo}/{file}", final, human(got))
    return CachedModel(repo, file, final, got, revision)


def header_problem(path: Path) -> str | None:
    """What is wrong with the model's LiteRT-LM header (the backend's own check), or None."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            return f"not a LiteRT-LM model: it does not start with {MAGIC.decode()}"
    from agentik_llm_litert.backend import check_model

    try:
        check_model(path)
    except SettingsError as e:
        return str(e).split(": ", 1)[-1]
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _safe(etag: str) -> str:
    return re.sub(r"[^\w.-]", "_", etag)[:80]


def _status(error: Any) -> int | str:
    response = getattr(error, "response", None)
    return response.status_code if response is not None else "an error"


def _kept(root: Path, repo: str, file: str) -> str:
    kept = partial_size(root, repo, file)
    return f" ({human(kept)} downloaded so far are kept: the next try resumes)" if kept else ""


class LogProgress:
    """The progress of a download as a log line per 10% (for logs, where a bar is noise).
    Duck-types the part of ``tqdm`` huggingface_hub uses."""

    def __init__(self, *, total: int | None = None, initial: int = 0, desc: str = "", **_: Any):
        self.total, self.done, self.desc = total, initial, desc
        self.logged = self._tenths()

    def _tenths(self) -> int:
        return self.done * 10 // self.total if self.total else 0

    def update(self, n: int) -> None:
        self.done += n
        tenths = self._tenths()
        if tenths > self.logged:
            self.logged = tenths
            log.info(
                "%s: %d%% (%s of %s)",
                self.desc,
                tenths * 10,
                human(self.done),
                human(self.total or 0),
            )

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def resolve(settings: Settings) -> tuple[Path, str]:
    """The model file to load and where it comes from: ``AGENTIK_GOOGLE_MODEL_PATH`` when set,
    else the cached ``AGENTIK_GOOGLE_MODEL_REPO``/``FILE``, fetched first when missing."""
    path = settings.get("AGENTIK_GOOGLE_MODEL_PATH")
    if path is not None:
        return path, "AGENTIK_GOOGLE_MODEL_PATH"
    root = models_dir(settings)
    repo, file = wanted(settings)
    model = cached(root, repo, file) or fetch(root, repo, file)
    return model.path, f"{repo}, cached in {root}"
