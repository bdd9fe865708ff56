"""The default on-device model: chosen when nothing is configured, fetched once from the hub
into the cache (resumed, verified), then used with no request; every failure is one line.

The hub is ``tests/fake_hub.py`` on loopback (``HF_ENDPOINT``) serving the committed tiny
LiteRT-LM model; the real hub is never reached (conftest sets ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("litert_lm")
pytest.importorskip("huggingface_hub")

from agentik.core.app import llm_choice, load_settings
from agentik.core.plugins import make_plugins
from agentik_llm_litert.models import LogProgress, human
from tests.conftest import BIN, free_port, read_sse
from tests.fake_hub import FakeHub, hub_env

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "tiny.litertlm"
REPLY = "Hello from the tiny model."
REPO, FILE = "agentik-test/tiny", "tiny.litertlm"


@pytest.fixture
def hub():
    hub = FakeHub({f"{REPO}/{FILE}": MODEL.read_bytes()}).start()
    yield hub
    hub.stop()


def model_env(hub: FakeHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    return hub_env(
        hub,
        tmp_path / "models",
        **{
            "AGENTIK_GOOGLE_MODEL_REPO": REPO,
            "AGENTIK_GOOGLE_MODEL_FILE": FILE,
            "AGENTIK_GOOGLE_THREADS": "1",
            "AGENTIK_GOOGLE_CACHE_DIR": str(tmp_path / "engine-cache"),
            **extra,
        },
    )


def agentik(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    return subprocess.run(
        [str(BIN / "agentik"), *args],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(out: str) -> str:
    """The one error line (the progress of a download may be logged before it)."""
    lines = [line for line in out.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in out, out
    assert out.rstrip().endswith(lines[0]), out
    return lines[0]


async def turn(base: str) -> str:
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{base}/agentik/conversations", json={})
        cid = (await r.json())["id"]
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        r = await s.post(
            f"{base}/agentik/conversations/{cid}/messages", json=[{"type": "text", "body": "hi"}]
        )
        assert r.status == 202, await r.text()
        frames = await read_sse(events)
        events.close()
    return "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")


# --- the choice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "chosen"),
    [
        ({}, ("litert", "no AGENTIK_LLM_BACKEND and no OPENAI_* set: the on-device default")),
        ({"OPENAI_MODEL": "m", "OPENAI_BASE_URL": "http://x/v1"}, ("openai", None)),
        ({"AGENTIK_LLM_BACKEND": "openai"}, ("openai", None)),
        ({"AGENTIK_LLM_BACKEND": "litert", "OPENAI_MODEL": "m"}, ("litert", None)),
    ],
)
def test_the_backend_is_chosen_from_what_is_configured(env, chosen):
    name, why = llm_choice(load_settings(make_plugins(env=env), env))
    assert name == chosen[0]
    if "OPENAI_MODEL" in env and "AGENTIK_LLM_BACKEND" not in env:
        assert why == "OPENAI_BASE_URL, OPENAI_MODEL set"
    else:
        assert why == chosen[1]


def test_without_the_on_device_backend_nothing_configured_asks_for_an_endpoint():
    from agentik.core.app import StartupError, select_llm
    from agentik.core.testing import test_plugins

    plugins = test_plugins(builtins=["agentik_llm_openai"])  # litert left out
    with pytest.raises(StartupError) as err:
        select_llm(plugins, load_settings(plugins, {}))
    assert str(err.value).startswith(
        "no LLM is configured and the default AGENTIK_LLM_BACKEND='litert': unknown llm backend"
    )
    assert "OPENAI_BASE_URL=http://localhost:11434/v1" in str(err.value)


def test_explicit_openai_without_its_variables_keeps_the_endpoint_hint(serve):
    proc, _ = serve({"AGENTIK_LLM_BACKEND": "openai"}, wait=False)
    assert proc.proc.wait(15) == 2
    line = one_line(proc.output)
    assert "OPENAI_API_KEY, OPENAI_MODEL must be set" in line
    assert "OPENAI_BASE_URL=http://localhost:11434/v1" in line


def test_only_an_openai_key_uses_openai_and_asks_for_the_model_in_one_line(serve):
    """A shell that exports only OPENAI_API_KEY: OpenAI's own endpoint (as the openai SDK),
    and one line saying the model is missing, not a hint about Ollama."""
    proc, _ = serve({"OPENAI_API_KEY": "sk-test"}, wait=False)
    assert proc.proc.wait(15) == 2
    line = one_line(proc.output)
    assert line.endswith(
        "OPENAI_MODEL must be set. the model to ask at https://api.openai.com/v1, e.g. gpt-4o-mini"
    )
    assert "11434" not in proc.output


def test_an_openai_key_and_model_start_against_openai(serve):
    proc, _ = serve({"OPENAI_API_KEY": "sk-test", "OPENAI_MODEL": "gpt-4o-mini"})
    banner = proc.wait_output("tokens:")
    assert "  llm: openai gpt-4o-mini @ https://api.openai.com/v1" in banner
    assert "  llm choice: openai (OPENAI_API_KEY, OPENAI_MODEL set)" in banner


def test_plugins_command_says_which_backend_and_why(tmp_path):
    out = agentik("plugins", env={"AGENTIK_MODELS_DIR": str(tmp_path)}).stdout
    assert "llm backend: litert (aliases: google) — selected" in out
    assert "llm: litert (no AGENTIK_LLM_BACKEND and no OPENAI_* set" in out
    assert "cache: not downloaded yet" in out


# --- the first serve, then the cache ------------------------------------------------------


async def test_first_serve_fetches_the_model_then_starts_from_the_cache_without_a_request(
    serve, hub, tmp_path
):
    env = model_env(hub, tmp_path)
    proc, base = serve(env)
    out = proc.wait_output("  tokens:")
    assert f"downloading {REPO}/{FILE} (423 kB) from {hub.url}" in out
    assert "tiny.litertlm: 100%" in out  # the log line of the progress (no terminal here)
    assert "llm choice: litert (no AGENTIK_LLM_BACKEND and no OPENAI_* set" in out
    assert f"llm model: {tmp_path / 'models' / REPO / FILE} ({REPO}, cached in" in out
    assert await turn(base) == REPLY  # on the real engine
    assert [r.method for r in hub.requests] == ["HEAD", "GET"]
    assert proc.stop() == 0, proc.output
    assert (tmp_path / "models" / REPO / FILE).read_bytes() == MODEL.read_bytes()

    proc, base = serve(env)
    proc.wait_output("  tokens:")
    assert len(hub.requests) == 2, hub.requests  # none at all on the second start
    assert await turn(base) == REPLY
    assert proc.stop() == 0, proc.output


def test_an_explicit_model_path_wins_and_asks_the_hub_nothing(serve, hub, tmp_path):
    proc, _ = serve(model_env(hub, tmp_path, AGENTIK_GOOGLE_MODEL_PATH=str(MODEL)))
    out = proc.wait_output("  tokens:")
    assert f"llm model: {MODEL} (AGENTIK_GOOGLE_MODEL_PATH)" in out
    assert hub.requests == []


# --- agentik models pull / list -----------------------------------------------------------


def test_pull_then_list_shows_the_cache_with_sizes(hub, tmp_path):
    env = model_env(hub, tmp_path)
    assert "no models in" in agentik("models", "list", env=env).stdout
    done = agentik("models", "pull", env=env)
    assert done.returncode == 0, done.stderr
    assert f"{REPO}/{FILE}: {tmp_path / 'models' / REPO / FILE} (423 kB)" in done.stdout
    listed = agentik("models", "list", env=env).stdout
    assert f"  423 kB  {REPO}/{FILE}  {tmp_path / 'models' / REPO / FILE}  (chosen)" in listed
    again = agentik("models", "pull", env=env)
    assert "is cached already" in again.stdout and len(hub.requests) == 2


def test_pull_of_another_repo_needs_its_file_and_says_how_to_use_it(hub, tmp_path):
    env = model_env(hub, tmp_path)
    assert "name the file too" in one_line(agentik("models", "pull", "other/x", env=env).stderr)
    hub.files["other/repo/m.litertlm"] = hub.files[f"{REPO}/{FILE}"]
    done = agentik("models", "pull", "other/repo", "m.litertlm", env=env)
    assert (
        "use it with AGENTIK_GOOGLE_MODEL_REPO=other/repo AGENTIK_GOOGLE_MODEL_FILE=m.litertlm"
        in (done.stdout)
    )


def test_a_download_cut_mid_body_is_resumed_in_the_same_run(hub, tmp_path):
    hub.cut_after = 100_000
    done = agentik("models", "pull", env=model_env(hub, tmp_path))
    assert done.returncode == 0, done.stderr
    gets = hub.gets()
    assert [g.range for g in gets] == [None, "bytes=100000-"]
    assert gets[1].sent == MODEL.stat().st_size - 100_000
    assert (tmp_path / "models" / REPO / FILE).read_bytes() == MODEL.read_bytes()


def test_an_interrupted_download_is_resumed_by_the_next_run(hub, tmp_path):
    env = model_env(hub, tmp_path)
    hub.cut_after, hub.fail_after_cut = 100_000, 503  # cut, then the hub is down
    failed = agentik("models", "pull", env=env)
    assert failed.returncode == 2
    line = one_line(failed.stderr)
    assert (
        f"{hub.url} answered 503" in line
        and "100 kB downloaded so far are kept: the next try resumes" in line
    )
    assert not (tmp_path / "models" / REPO / FILE).exists()  # nothing half-written in place
    assert "100 kB" in agentik("models", "list", env=env).stdout  # the partial download
    hub.fail_after_cut = None
    done = agentik("models", "pull", env=env)
    assert done.returncode == 0, done.stderr
    last = hub.gets()[-1]
    assert last.range == "bytes=100000-" and last.sent == MODEL.stat().st_size - 100_000
    assert (tmp_path / "models" / REPO / FILE).read_bytes() == MODEL.read_bytes()
    assert not list((tmp_path / "models" / ".partial").rglob("*.part"))


@pytest.mark.parametrize(
    ("served", "why"),
    [
        ("other bytes", "its sha256 is not the hub's"),  # not what the hub's etag says
        ("a text file", "not a LiteRT-LM model"),  # what the hub says, but no model
        ("a cut model", "not a valid LiteRT-LM model"),
    ],
)
def test_a_corrupt_download_is_refused_and_deleted(serve, hub, tmp_path, served, why):
    good = MODEL.read_bytes()
    if served == "other bytes":
        hub.body_override = bytes(len(good))
    elif served == "a text file":
        hub.files[f"{REPO}/{FILE}"] = b"no model here\n" * 100
    else:
        hub.files[f"{REPO}/{FILE}"] = good[:64]  # a header cut short
    proc, _ = serve(model_env(hub, tmp_path), wait=False)
    assert proc.proc.wait(30) == 2
    line = one_line(proc.output)
    assert "is corrupt" in line and why in line and "was deleted" in line
    assert not (tmp_path / "models" / REPO / FILE).exists()
    assert not list((tmp_path / "models").rglob("*.part"))


def test_a_cached_model_whose_size_changed_is_fetched_again(hub, tmp_path):
    env = model_env(hub, tmp_path)
    assert agentik("models", "pull", env=env).returncode == 0
    path = tmp_path / "models" / REPO / FILE
    path.write_bytes(path.read_bytes()[:1000])
    assert "no models in" in agentik("models", "list", env=env).stdout
    assert agentik("models", "pull", env=env).returncode == 0
    assert path.read_bytes() == MODEL.read_bytes() and len(hub.gets()) == 2


# --- failures: one start-up line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("fail", "hint"),
    [
        ((401, "GatedRepo"), "is gated on"),
        ((401, None), "refused agentik-test/tiny/tiny.litertlm (401)"),
        ((401, "RepoNotFound"), "no repository agentik-test/tiny that it shows without a token"),
        ((403, "GatedRepo"), "is gated on"),
    ],
)
def test_a_gated_or_private_repo_gives_the_token_hint(serve, hub, tmp_path, fail, hint):
    hub.fail = fail
    proc, _ = serve(model_env(hub, tmp_path), wait=False)
    assert proc.proc.wait(15) == 2
    line = one_line(proc.output)
    assert hint in line and "set HF_TOKEN" in line and "AGENTIK_GOOGLE_MODEL_PATH" in line


def test_a_missing_file_or_repo_names_the_setting(hub, tmp_path):
    env = model_env(hub, tmp_path, AGENTIK_GOOGLE_MODEL_FILE="nope.litertlm")
    assert "check AGENTIK_GOOGLE_MODEL_FILE" in one_line(agentik("models", "pull", env=env).stderr)
    env = model_env(hub, tmp_path, AGENTIK_GOOGLE_MODEL_REPO="nobody/nothing")
    assert "check AGENTIK_GOOGLE_MODEL_REPO" in one_line(agentik("models", "pull", env=env).stderr)


def test_the_token_goes_to_the_hub(hub, tmp_path):
    done = agentik("models", "pull", env=model_env(hub, tmp_path, HF_TOKEN="hf_secret"))
    assert done.returncode == 0, done.stderr
    assert {r.authorization for r in hub.requests} == {"Bearer hf_secret"}


def test_no_network_is_one_line_with_the_choices(serve, tmp_path):
    down = FakeHub()
    down.url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc, _ = serve(model_env(down, tmp_path), wait=False)
    assert proc.proc.wait(30) == 2
    line = one_line(proc.output)
    assert f"cannot reach the model hub {down.url}" in line
    assert "OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL" in line
    assert "AGENTIK_GOOGLE_MODEL_PATH" in line


def test_offline_without_the_model_is_one_line(serve, tmp_path):
    proc, _ = serve({"HF_HUB_OFFLINE": "1"}, wait=False)  # nothing configured at all
    assert proc.proc.wait(15) == 2
    line = one_line(proc.output)
    assert "HF_HUB_OFFLINE is set and litert-community/Qwen3-0.6B/Qwen3-0.6B.litertlm" in line


def test_progress_in_logs_is_a_line_per_tenth(caplog):
    caplog.set_level(logging.INFO, "agentik_llm_litert.models")
    with LogProgress(total=2_000_000, initial=0, desc="m.litertlm") as bar:
        for _ in range(40):
            bar.update(50_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"m.litertlm: {p}% ({human(p * 20_000)} of 2 MB)" for p in range(10, 101, 10)]


def test_a_full_disk_is_one_line(hub, tmp_path):
    import hashlib

    etag = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    part = tmp_path / "models" / ".partial" / REPO / f"{FILE}.{etag}.part"
    part.parent.mkdir(parents=True)
    part.symlink_to("/dev/full")  # every write there fails with ENOSPC
    failed = agentik("models", "pull", env=model_env(hub, tmp_path))
    assert failed.returncode == 2
    line = one_line(failed.stderr)
    assert "the disk is full" in line and "AGENTIK_MODELS_DIR" in line, line


def test_a_cached_model_is_used_without_importing_the_hub_client(hub, tmp_path):
    import sys

    env = model_env(hub, tmp_path)
    assert agentik("models", "pull", env=env).returncode == 0
    code = (
        "import sys; from agentik.core.app import load_settings; "
        "from agentik.core.plugins import make_plugins; "
        "from agentik_llm_litert.models import resolve; "
        "print(resolve(load_settings(make_plugins()))); "
        "print(sorted(m for m in ('huggingface_hub', 'httpx2') if m in sys.modules))"
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**full, **env}, capture_output=True, text=True
    )
    assert out.stdout.splitlines()[-1] == "[]", out
    assert f"{REPO}, cached in" in out.stdout and len(hub.requests) == 2
