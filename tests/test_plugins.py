"""Plugin discovery and selection: entry points, failures, switches, the registry, settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentik.core.app import StartupError, load_settings, registries, select_llm
from agentik.core.plugins import PluginError, make_plugins
from agentik.core.registry import BackendError, BackendRegistry
from agentik.core.settings import Setting, Settings, SettingsError, parse_port
from agentik.core.testing import temporary_plugin, test_plugins
from agentik.hookspecs import hookimpl

ROOT = Path(__file__).resolve().parent.parent


def install_fake_dist(tmp_path: Path, monkeypatch, name: str, module_source: str) -> None:
    """A real installed distribution on sys.path: a module plus its dist-info entry point."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[agentik]\n{name} = {name}\n")
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop(name, None)


def test_builtins_are_discovered_through_entry_points():
    plugins = make_plugins(env={})
    for name in ("agentik_llm_openai", "agentik_transport_http"):
        info = plugins.infos[name]
        assert (info.status, info.dist) == ("ok", "agentik-runtime")
        assert info.hooks
    assert plugins.infos["agentik.core"].status == "ok"


def test_a_plugin_that_fails_to_import_is_reported_and_skipped(tmp_path, monkeypatch):
    install_fake_dist(tmp_path, monkeypatch, "agentik_broken", "raise ImportError('no numpy')")
    plugins = make_plugins(env={})
    info = plugins.infos["agentik_broken"]
    assert info.status == "failed" and "no numpy" in info.error
    assert plugins.infos["agentik_transport_http"].status == "ok"
    with pytest.raises(
        PluginError, match="plugin agentik_broken: import failed: ImportError: no numpy"
    ):
        make_plugins(env={"AGENTIK_STRICT_PLUGINS": "1"})


def test_a_misspelt_hook_is_caught_by_check_pending(tmp_path, monkeypatch):
    install_fake_dist(
        tmp_path,
        monkeypatch,
        "agentik_typo",
        """
        from agentik import hookimpl

        @hookimpl
        def register_llm_backend(register):
            pass
    """,
    )
    plugins = make_plugins(env={})
    info = plugins.infos["agentik_typo"]
    assert info.status == "failed" and "register_llm_backend" in info.error
    assert plugins.pm.get_plugin("agentik_typo") is None


def test_load_and_disable_switches(tmp_path, monkeypatch):
    none = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "none"})
    assert {n for n, i in none.infos.items() if i.status == "ok"} == {"agentik.core"}
    only = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "agentik_transport_http"})
    assert only.infos["agentik_transport_http"].status == "ok"
    assert only.infos["agentik_llm_openai"].status == "skipped"
    blocked = make_plugins(env={"AGENTIK_DISABLE_PLUGINS": "agentik_llm_openai"})
    assert blocked.infos["agentik_llm_openai"].status == "blocked"
    assert blocked.pm.get_plugin("agentik_llm_openai") is None
    by_dist = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "agentik-runtime"})
    assert by_dist.infos["agentik_llm_openai"].status == "ok"


class Dummy:
    def __init__(self, name: str, aliases=()) -> None:
        self.name, self.aliases = name, aliases

    @hookimpl
    def register_llm_backends(self, register):
        register(self.name, lambda settings: None, aliases=self.aliases)


def test_a_backend_name_registered_twice_stops_start_up_only_when_selected(caplog):
    """Issue #28 (8): two plugins registering one name used to stop every start-up, even when
    neither was selected; now it is a warning, and an error naming both only if selected."""
    plugins = test_plugins(
        [("plugin_a", Dummy("same")), ("plugin_b", Dummy("other", ["same"]))],
        builtins=["agentik_llm_openai"],
    )
    regs = registries(plugins)  # no error: nobody selected 'same'
    assert caplog.messages == [
        "llm backend 'same' is registered by both plugin_a and plugin_b; "
        "disable one with AGENTIK_DISABLE_PLUGINS"
    ]
    assert regs["llm"].get("other", variable="AGENTIK_LLM_BACKEND").plugin == "plugin_b"
    assert regs["llm"].get("openai", variable="AGENTIK_LLM_BACKEND").plugin == "agentik_llm_openai"
    with pytest.raises(BackendError, match="'same' is registered by both plugin_a and plugin_b"):
        regs["llm"].get("same", variable="AGENTIK_LLM_BACKEND")
    problems: list[str] = []
    registries(plugins, problems)
    assert problems == caplog.messages


def test_unknown_backend_lists_the_available_ones():
    plugins = test_plugins([("plugin_a", Dummy("alpha"))], builtins=["agentik_llm_openai"])
    settings = load_settings(plugins, {"AGENTIK_LLM_BACKEND": "gamma"})
    with pytest.raises(StartupError, match=r"AGENTIK_LLM_BACKEND='gamma'.*alpha, openai"):
        select_llm(plugins, settings)


def test_a_backend_whose_extra_is_missing_names_its_own_distribution():
    reg = BackendRegistry("llm")
    register = reg.register_for("agentik_llm_fancy", "agentik-llm-fancy")
    register("fancy", lambda s: None, requires=("no_such_module_xyz",), extra="gpu")
    with pytest.raises(
        BackendError, match=r"needs no_such_module_xyz; pip install 'agentik-llm-fancy\[gpu\]'"
    ):
        reg.get("fancy", variable="AGENTIK_LLM_BACKEND")
    # a built-in plugin's distribution is agentik-runtime itself (`agentik` on PyPI is another)
    builtin = BackendRegistry("llm")
    builtin.register_for("agentik_llm_litert", "agentik-runtime")(
        "litert", lambda s: None, requires=("no_such_module_xyz",), extra="litert"
    )
    with pytest.raises(BackendError, match=r"pip install 'agentik-runtime\[litert\]'"):
        builtin.get("litert", variable="AGENTIK_LLM_BACKEND")


def test_aliases_and_case_select_the_same_backend():
    reg = BackendRegistry("llm")
    reg.register_for("p")("litert", lambda s: "engine", aliases=("google",))
    assert reg.get("GOOGLE", variable="X").name == "litert"


def test_no_llm_configured_says_exactly_what_to_set():
    plugins = test_plugins(builtins=["agentik_llm_openai"])
    with pytest.raises(StartupError) as e:
        select_llm(plugins, load_settings(plugins, {}))
    message = str(e.value)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        assert name in message
    assert "http://localhost:11434/v1" in message


def test_settings_blank_means_default_and_invalid_names_the_variable():
    declared = [
        Setting("AGENTIK_PORT", 8080, parse_port),
        Setting("SECRET", None, int, secret=True),
    ]
    assert Settings(declared, {"AGENTIK_PORT": "  "})["AGENTIK_PORT"] == 8080
    assert Settings(declared, {"AGENTIK_PORT": "9000"})["AGENTIK_PORT"] == 9000
    with pytest.raises(SettingsError, match=r"AGENTIK_PORT='http' is invalid"):
        Settings(declared, {"AGENTIK_PORT": "http"})
    with pytest.raises(SettingsError, match="AGENTIK_PORT") as e:
        Settings(declared, {"AGENTIK_PORT": "70000", "SECRET": "hunter2"})
    assert "hunter2" not in str(e.value)


def test_every_core_setting_is_declared_with_help():
    plugins = test_plugins(builtins=["agentik_llm_openai", "agentik_transport_http"])
    settings = load_settings(plugins, {})
    for name, setting in settings.declared.items():
        assert setting.help, name
        assert setting.plugin, name


def test_temporary_plugin_registers_for_a_block():
    plugins = test_plugins()
    with temporary_plugin(plugins, Dummy("temp"), "temp_plugin"):
        assert "temp" in registries(plugins)["llm"].backends
    assert "temp" not in registries(plugins)["llm"].backends


def test_the_all_extra_holds_every_feature_extra():
    """`make serve` installs the `all` extra: every backend and transport the product names is in
    it (the vector memory was not), on every Python its markers cover."""
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {
        name: {str(Requirement(line)) for line in value.strip().splitlines()}
        for name, value in cfg["options.extras_require"].items()
    }
    for name, requirements in extras.items():
        if name not in ("all", "bench", "test"):
            assert requirements <= extras["all"], (name, requirements - extras["all"])
    dist = cfg["metadata"]["name"]
    assert any(
        Requirement(r).name == dist and "all" in Requirement(r).extras for r in extras["test"]
    )
    hnsw = {r for r in extras["all"] if Requirement(r).name in ("chroma-hnswlib", "hnswlib")}
    for python in ("3.11", "3.12", "3.13", "3.14"):  # exactly one provides the hnswlib module
        env = {"python_version": python}
        assert sum(bool(Requirement(r).marker.evaluate(env)) for r in hnsw) == 1, python


def test_builtin_plugins_import_no_heavy_module():
    code = (
        "import sys, agentik.core.cli, agentik_llm_openai, agentik_transport_http,"
        " agentik_tools_mcp, agentik_llm_litert, agentik_embedding_siglip,"
        " agentik_transport_mcp_server, agentik_transport_openai, agentik_metrics, agentik_otel;"
        "from agentik.core.plugins import make_plugins; make_plugins();"
        "heavy = [m for m in ('openai', 'httpx2', 'pydantic', 'pydantic_core', 'mcp',"
        " 'litert_lm', 'onnxruntime', 'sentencepiece', 'numpy', 'hnswlib', 'a2a', 'ag_ui',"
        " 'huggingface_hub', 'google.protobuf', 'prometheus_client', 'opentelemetry')"
        " if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


HEAVY = (
    "openai", "httpx", "pydantic", "pydantic_core", "mcp", "litert_lm", "onnxruntime",
    "sentencepiece", "numpy", "hnswlib", "a2a", "ag_ui", "huggingface_hub", "google.protobuf",
)  # fmt: skip


def test_a_bare_server_started_and_serving_loads_no_heavy_module(tmp_path):
    """``agentik serve``'s app with every installed plugin and the default settings, started
    (its services run) and asked for its pages: none of them maps a heavy module (idle RSS)."""
    code = f"""
import asyncio, sys
from aiohttp.test_utils import TestClient, TestServer
from agentik.core.cli import _bootstrap
from agentik.core.app import create_app

async def main():
    plugins, settings = _bootstrap()
    client = TestClient(TestServer(create_app(settings, plugins)))
    await client.start_server()
    for path in ("/health", "/agentik/conversations", "/a2a/.well-known/agent-card.json", "/"):
        async with client.get(path) as r:
            assert r.status < 500, (path, r.status)
    await client.close()
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    print(heavy)
    sys.exit(1 if heavy else 0)

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))} | {
        "HOME": str(tmp_path),
        "AGENTIK_DB_PATH": str(tmp_path / "a.db"),
        "AGENTIK_MEMORY_DIR": str(tmp_path / "memory"),
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_MODEL": "m",
        "OPENAI_API_KEY": "sk-test",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr


def throwaway_venv(tmp_path: Path) -> tuple[Path, str]:
    """A venv whose agentik and dependencies come from this environment: ``(venv, its
    site-packages)``; what a test installs into it is installed for real."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # as site dirs, so their own .pth files (agentik's editable install among them) work too
    ours = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    )
    return venv, site


def test_example_third_party_plugin_installs_and_is_selectable(tmp_path):
    """pip-install examples/agentik-llm-echo into a throwaway venv and use it."""
    venv, site = throwaway_venv(tmp_path)
    py = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            site,
            str(ROOT / "examples" / "agentik-llm-echo"),
        ],
        check=True,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    listing = subprocess.run(
        [py, "-m", "agentik", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    import json

    report = {p["name"]: p for p in json.loads(listing)["plugins"]}
    echo = report["agentik_llm_echo"]
    assert echo["status"] == "ok" and echo["dist"] == "agentik-llm-echo"
    assert echo["backends"][0]["name"] == "echo"
    assert [s["name"] for s in echo["settings"]] == ["ECHO_PREFIX"]
    run = textwrap.dedent("""
        import asyncio
        from agentik.core.app import create_app, AGENT
        from agentik.core.types import TextPart

        async def main():
            app = create_app()
            agent = app[AGENT]
            await agent.llm.start(); await agent.open()
            conv = await agent.create_conversation(temp=True)
            await conv.send([TextPart("shout hi")])
            while conv.busy:
                await asyncio.sleep(0.01)
            print([m.kind for m in await conv.get_messages()])
            print((await conv.get_messages())[-1].payload["text"])
            await agent.close()

        asyncio.run(main())
    """)
    out = subprocess.run(
        [py, "-c", run],
        capture_output=True,
        text=True,
        check=True,
        env={
            **env,
            "AGENTIK_LLM_BACKEND": "reverse",
            "ECHO_PREFIX": ">",
            "AGENTIK_DB_PATH": ":memory:",
            "AGENTIK_MEMORY_BACKEND": "off",  # the built-in plugins are not importable here
        },
    ).stdout.splitlines()
    assert out == ["['user', 'tool_call', 'tool_result', 'assistant']", ">HI"]
    # its own tests, as its author runs them: agentik's pytest plugin brings the fixtures
    tests = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT / "examples" / "agentik-llm-echo",
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout


def test_trace_plugins_logs_hook_calls(caplog):
    import logging

    from agentik.core.app import collect_prompt_sections

    caplog.set_level(logging.INFO, logger="agentik.plugins.trace")
    plugins = make_plugins(env={"AGENTIK_TRACE_PLUGINS": "1", "AGENTIK_LOAD_PLUGINS": "none"})
    collect_prompt_sections(plugins, load_settings(plugins, {}))
    lines = [r.getMessage() for r in caplog.records]
    assert "register_prompt_sections(register, settings) -> [agentik.core]" in lines
    # issue #28: a register_* hook returns nothing; the trace shows what it registered
    assert (
        "register_prompt_sections of agentik.core: "
        "register('base', register_prompt_sections.<locals>.<lambda>, order=100)"
    ) in lines
    assert "register_settings of agentik.core: register(Setting('AGENTIK_PORT'))" in lines
    assert not [line for line in lines if line.endswith("returned []")]
    caplog.clear()
    quiet = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "none"})
    collect_prompt_sections(quiet, load_settings(quiet, {}))
    assert not caplog.records  # off unless asked


# --- a plugin author's mistakes, through the real entry-point path ---------------------------
#
# One throwaway distribution, pip-installed once for this module, holds several small plugins
# (one entry point each); a test picks the ones it wants with AGENTIK_LOAD_PLUGINS.

AUTHOR_PLUGINS = {
    "at_context": """
        from agentik import hookimpl

        @hookimpl
        def before_turn(text):
            return f"[context for {text}]"

        @hookimpl
        def after_turn(conversation, user_text):
            async def note():
                conversation.agent.state.setdefault("at_context", []).append(user_text)
            return note()
    """,
    "at_broken_turn": """
        from agentik import hookimpl

        @hookimpl
        def before_turn():
            raise RuntimeError("prefetch down")

        @hookimpl
        def after_turn():
            raise RuntimeError("review down")
    """,
    "at_async": """
        from agentik import hookimpl

        @hookimpl
        async def before_turn(text):
            return "never awaited"
    """,
    "at_factory_boom": """
        from agentik import hookimpl

        def make(settings):
            raise RuntimeError("no GPU here")

        @hookimpl
        def register_llm_backends(register):
            register("boom", make)
    """,
    "at_transport_boom": """
        from agentik import hookimpl

        def setup(app, agent, settings):
            raise KeyError("ROUTES_FILE")

        @hookimpl
        def register_transports(register):
            register("broken", setup)
    """,
    "at_wrong_register": """
        from agentik import hookimpl

        @hookimpl
        def register_tools(register):
            register(lambda sides: sides)
    """,
    "at_dice_small": """
        from agentik import hookimpl
        from agentik.core.settings import Setting, parse_positive_int

        @hookimpl
        def register_settings(register):
            register(Setting("DICE_MAX_SIDES", 6, parse_positive_int, "Largest die."))
    """,
    "at_dice_big": """
        from agentik import hookimpl
        from agentik.core.settings import Setting, parse_positive_int

        @hookimpl
        def register_settings(register):
            register(Setting("DICE_MAX_SIDES", 100, parse_positive_int, "Largest die."))
    """,
    "at_shares_openai": """
        from agentik import hookimpl
        from agentik.core.settings import Setting, parse_url

        @hookimpl
        def register_settings(register):
            register(Setting("OPENAI_BASE_URL", "https://api.openai.com/v1", parse_url, "Also."))
    """,
    "at_claims_openai": """
        from agentik import hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("openai", lambda settings: None)
    """,
    "at_extra": """
        from agentik import hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("fancy", lambda s: None, requires=("no_such_module_xyz",), extra="gpu")
    """,
    "at_routes": """
        from aiohttp import web
        from agentik import hookimpl
        from agentik.core.testing import ScriptedLLM

        class Described(ScriptedLLM):
            description = "described v2 (scripted)"

        async def ping(request):
            return web.Response(text="pong")

        @hookimpl
        def register_llm_backends(register):
            register("described", lambda settings: Described())

        @hookimpl
        def register_transports(register):
            register("ping", lambda app, agent, settings: app.router.add_get("/ping", ping))
    """,
}
AUTHOR_DIST = "agentik-author-mistakes"
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]


def install_plugins(
    tmp_path_factory, dist: str, sources: dict[str, str], entry_points: dict[str, str] | None = None
) -> Path:
    """One throwaway distribution ``dist`` of single-module plugins (module -> source; entry
    point -> module, by default each module under its own name), pip-installed for real into a
    folder, which is returned (for sys.path / PYTHONPATH)."""
    src = tmp_path_factory.mktemp(f"{dist}_src")
    for name, code in sources.items():
        (src / f"{name}.py").write_text(textwrap.dedent(code))
    points = entry_points or {name: name for name in sources}
    lines = "\n".join(f"    {name} = {module}" for name, module in points.items())
    (src / "setup.cfg").write_text(
        f"[metadata]\nname = {dist}\nversion = 0.1\n\n[options]\n"
        f"py_modules = {', '.join(sources)}\n\n[options.entry_points]\nagentik =\n{lines}\n"
    )
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    site = tmp_path_factory.mktemp(f"{dist}_site")
    subprocess.run([*PIP_INSTALL, "--target", str(site), str(src)], check=True, capture_output=True)
    return site


@pytest.fixture(scope="module")
def author_site(tmp_path_factory) -> Path:
    """The throwaway distribution, pip-installed into a folder put on sys.path / PYTHONPATH."""
    return install_plugins(tmp_path_factory, AUTHOR_DIST, AUTHOR_PLUGINS)


@pytest.fixture
def author_plugins(author_site, monkeypatch):
    """``load(*names, **env)``: a manager with the built-ins and the named throwaway plugins."""
    monkeypatch.syspath_prepend(str(author_site))
    for name in AUTHOR_PLUGINS:
        sys.modules.pop(name, None)

    def load(*names: str, builtins=("agentik_transport_http",), **env: str):
        allow = ",".join([*builtins, *names]) or "none"
        return make_plugins(env={"AGENTIK_LOAD_PLUGINS": allow, **env})

    return load


def run_cli(author_site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``agentik ARGS`` in a child process that sees the throwaway distribution."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    full.update(PYTHONPATH=str(author_site), AGENTIK_DB_PATH=":memory:", AGENTIK_PORT="0", **env)
    return subprocess.run(
        [sys.executable, "-m", "agentik", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )


async def test_a_failing_turn_hook_loses_only_its_own_contribution(author_plugins, caplog):
    from agentik.core.app import AGENT, create_app
    from agentik.core.testing import ScriptedLLM
    from agentik.core.types import TextPart

    plugins = author_plugins("at_broken_turn", "at_context")
    llm = ScriptedLLM()
    app = create_app(load_settings(plugins, {"AGENTIK_DB_PATH": ":memory:"}), plugins, llm=llm)
    agent = app[AGENT]
    await agent.open()
    try:
        conv = await agent.create_conversation()
        await conv.send([TextPart("cats")])
        await conv.wait_idle()
        await agent.jobs.wait_idle()
        assert llm.received[0][0].text == "[context for cats]\n\ncats"
        assert agent.state["at_context"] == ["cats"]  # the working after_turn ran
        lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        where = f"of plugin at_broken_turn in {conv.id} failed: RuntimeError"
        assert lines == [f"before_turn {where}: prefetch down", f"after_turn {where}: review down"]
        assert "Traceback" not in caplog.text  # one line each; the traceback at debug level
    finally:
        await agent.close()


def test_an_async_def_hook_is_refused_naming_plugin_hook_and_fix(author_plugins):
    plugins = author_plugins("at_async")
    info = plugins.infos["at_async"]
    assert info.status == "failed"
    assert "hook before_turn is `async def`" in info.error and "plain `def`" in info.error
    assert plugins.pm.get_plugin("at_async") is None
    with pytest.raises(PluginError, match=r"plugin at_async: loading failed: .*before_turn"):
        author_plugins("at_async", AGENTIK_STRICT_PLUGINS="1")


@pytest.mark.parametrize(
    ("names", "env", "message"),
    [
        (
            "at_factory_boom",
            {"AGENTIK_LLM_BACKEND": "boom"},
            "plugin at_factory_boom: creating the llm backend 'boom' failed: "
            "RuntimeError: no GPU here",
        ),
        (
            "at_transport_boom,at_routes",
            {"AGENTIK_LLM_BACKEND": "described"},
            "plugin at_transport_boom: register_transports failed: KeyError: 'ROUTES_FILE'",
        ),
        (
            "at_wrong_register,at_routes",
            {"AGENTIK_LLM_BACKEND": "described"},
            "plugin at_wrong_register: register_tools failed: TypeError: register() takes a "
            "Tool (see agentik.core.tools.tool), not function",
        ),
    ],
)
def test_start_up_errors_of_plugin_code_are_one_line_naming_the_plugin(
    author_site, names, env, message
):
    result = run_cli(author_site, "serve", AGENTIK_LOAD_PLUGINS=names, **env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"agentik: error: {message}"
    assert "Traceback" not in result.stderr
    strict = run_cli(
        author_site, "serve", AGENTIK_LOAD_PLUGINS=names, AGENTIK_STRICT_PLUGINS="1", **env
    )
    assert strict.returncode == 2
    assert "Traceback" in strict.stderr and strict.stderr.strip().endswith(message)


def test_conflicting_setting_declarations_name_both_plugins(author_plugins):
    plugins = author_plugins("at_dice_small", "at_dice_big")
    with pytest.raises(SettingsError) as e:
        load_settings(plugins, {})
    assert str(e.value).startswith(
        "DICE_MAX_SIDES is declared differently by at_dice_big (default: 100) and at_dice_small "
        "(default: 6)"
    )
    # sharing a variable on purpose, declared alike, is fine
    shared = author_plugins("at_shares_openai", builtins=("agentik_llm_openai",))
    settings = load_settings(shared, {"OPENAI_BASE_URL": "http://x/v1/"})
    assert settings["OPENAI_BASE_URL"] == "http://x/v1"


def test_plugins_command_always_runs_and_shows_the_conflict(author_site):
    import json

    result = run_cli(
        author_site,
        "plugins",
        "--json",
        AGENTIK_LOAD_PLUGINS="agentik_llm_openai,at_claims_openai,at_dice_small,at_dice_big",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (
        "llm backend 'openai' is registered by both agentik_llm_openai and at_claims_openai; "
        "disable one with AGENTIK_DISABLE_PLUGINS"
    ) in report["problems"]
    assert report["invalidSettings"].startswith("DICE_MAX_SIDES is declared differently")
    assert {p["name"] for p in report["plugins"]} >= {"at_claims_openai", "agentik_llm_openai"}
    text = run_cli(author_site, "plugins", AGENTIK_LOAD_PLUGINS="at_claims_openai,agentik-runtime")
    assert text.returncode == 0
    assert "problem: llm backend 'openai' is registered by both" in text.stdout


def test_a_missing_extra_names_the_plugins_own_distribution(author_plugins):
    plugins = author_plugins("at_extra")
    settings = load_settings(plugins, {"AGENTIK_LLM_BACKEND": "fancy"})
    with pytest.raises(StartupError, match=rf"pip install '{AUTHOR_DIST}\[gpu\]'"):
        select_llm(plugins, settings)


def test_a_backend_factory_that_is_not_callable_names_the_plugin():
    class Wrong:
        @hookimpl
        def register_llm_backends(self, register):
            register("wrong", "wrong_backend:make")

    with pytest.raises(PluginError, match="plugin wrong: register_llm_backends failed: TypeError"):
        registries(test_plugins([("wrong", Wrong())], builtins=[]))


def test_unknown_plugin_names_are_warned_with_the_closest(author_plugins):
    plugins = make_plugins(
        env={
            "AGENTIK_LOAD_PLUGINS": "agentik_transport_htp,agentik_llm_openai",
            "AGENTIK_DISABLE_PLUGINS": "agentik_llm_opena",
        }
    )
    assert plugins.warnings == [
        "AGENTIK_LOAD_PLUGINS: no installed plugin is called 'agentik_transport_htp' "
        "(did you mean 'agentik_transport_http'?)",
        "AGENTIK_DISABLE_PLUGINS: no installed plugin is called 'agentik_llm_opena' "
        "(did you mean 'agentik_llm_openai'?)",
    ]
    assert make_plugins(env={"AGENTIK_LOAD_PLUGINS": "agentik-runtime,none"}).warnings == []


def test_a_disabled_backend_is_reported_as_disabled_by_its_variable(author_plugins):
    disabled = make_plugins(
        env={
            "AGENTIK_LOAD_PLUGINS": "agentik-runtime",
            "AGENTIK_DISABLE_PLUGINS": "agentik_llm_litert",
        }
    )
    settings = load_settings(disabled, {"AGENTIK_LLM_BACKEND": "google"})
    with pytest.raises(
        StartupError,
        match="AGENTIK_LLM_BACKEND='google': the llm backend 'google' comes from plugin "
        "agentik_llm_litert, which AGENTIK_DISABLE_PLUGINS disables",
    ):
        select_llm(disabled, settings)
    skipped = author_plugins("at_extra")  # AGENTIK_LOAD_PLUGINS leaves at_routes out
    with pytest.raises(StartupError, match="at_routes, which AGENTIK_LOAD_PLUGINS does not list"):
        select_llm(skipped, load_settings(skipped, {"AGENTIK_LLM_BACKEND": "described"}))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ten", "AGENTIK_EVENT_BUFFER='ten' is invalid: must be a whole number, e.g. 10"),
        ("-3", "AGENTIK_EVENT_BUFFER='-3' is invalid: must be a whole number greater than 0"),
    ],
)
def test_invalid_numbers_say_what_was_expected(value, expected):
    plugins = test_plugins(builtins=[])
    with pytest.raises(SettingsError) as e:
        load_settings(plugins, {"AGENTIK_EVENT_BUFFER": value})
    assert str(e.value) == expected
    with pytest.raises(SettingsError, match=r"must be a number, e\.g\. 2\.5"):
        load_settings(plugins, {"AGENTIK_TOOL_TIMEOUT": "soon"})


async def test_banner_shows_every_backends_description_and_plugin_routes(author_plugins):
    from aiohttp.test_utils import TestServer

    from agentik.core.app import create_app
    from agentik.core.cli import banner

    plugins = author_plugins("at_routes")
    settings = load_settings(
        plugins, {"AGENTIK_DB_PATH": ":memory:", "AGENTIK_LLM_BACKEND": "described"}
    )
    app = create_app(settings, plugins)
    server = TestServer(app)
    await server.start_server()
    try:
        lines = await banner(app, "127.0.0.1", 8080)
    finally:
        await server.close()
    assert "  llm: described v2 (scripted)" in lines
    assert "  GET  /ping" in lines
    # the HTTP API's own banner lines list its routes: not listed again as unannounced
    listed = [line for line in lines if "/agentik/conversations/{id}/messages " in line]
    assert [line.split()[0] for line in listed] == ["POST", "GET"]


def test_trace_plugins_traces_the_register_hooks_too(author_plugins, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="agentik.plugins.trace")
    plugins = author_plugins("at_routes", AGENTIK_TRACE_PLUGINS="1")
    load_settings(plugins, {})
    registries(plugins)
    lines = [r.getMessage() for r in caplog.records]
    assert "register_settings(register) -> [agentik.core]" in lines
    assert "register_llm_backends(register) -> [at_routes]" in lines


def test_an_undeclared_agentik_variable_gets_one_warning_with_the_closest_name(serve):
    """Issue #7, settings hygiene: a migrated configuration never silently loses a feature."""
    proc, _ = serve(
        {
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "OPENAI_API_KEY": "k",
            "OPENAI_MODEL": "m",
            "AGENTIK_SYSTEM_PROMT": "You are Ada.",  # a typo
            "AGENTIK_RETIRED_FEATURE": "1",  # no loaded plugin reads it
            "OPENAI_CONTEXT_WINDOWS": "8000",  # a typo of the other namespace
        }
    )
    output = proc.wait_output("agentik listening")
    assert (
        output.count(
            "OPENAI_CONTEXT_WINDOWS is set but no loaded plugin declares it (did you mean "
            "OPENAI_CONTEXT_WINDOW?) (OPENAI_* belongs to plugin agentik_llm_openai); it is "
            "ignored"
        )
        == 1
    )
    typo = (
        "AGENTIK_SYSTEM_PROMT is set but no loaded plugin declares it "
        "(did you mean AGENTIK_SYSTEM_PROMPT?); it is ignored"
    )
    assert output.count(typo) == 1
    assert output.count("AGENTIK_RETIRED_FEATURE is set but no loaded plugin declares it") == 1
    assert "AGENTIK_PORT is set" not in output  # declared ones are quiet


def test_openai_typos_are_warned_about_like_agentik_ones():
    """The openai plugin claims OPENAI_*: a typo (or the legacy OPENAI_API_BASE) gets the
    AGENTIK_* warning; the variables the openai SDK itself reads (a shell may export them for
    other tools) and other prefixes are left alone."""
    from agentik.core.app import declared_settings
    from agentik.core.settings import undeclared_variables

    settings = Settings(declared_settings(test_plugins(builtins=["agentik_llm_openai"])), {})
    env = {
        "AGENTIK_PORT": "1",
        "AGENTIK_PROT": "2",
        "HOME": "/root",
        "OPENAI_MODLE": "x",
        "OPENAI_API_BASE": "http://x/v1",  # the legacy name of the base URL
        "OPENAI_ORG_ID": "org-1",
        "OPENAI_PROJECT_ID": "p",
        "MY_OPENAI_MODLE": "x",
    }
    owner = "(OPENAI_* belongs to plugin agentik_llm_openai)"
    assert undeclared_variables(settings.declared, env, settings.prefixes, settings.others) == [
        "AGENTIK_PROT is set but no loaded plugin declares it (did you mean AGENTIK_PORT?); "
        "it is ignored",
        "OPENAI_API_BASE is set but no loaded plugin declares it (did you mean "
        f"OPENAI_API_KEY?) {owner}; it is ignored",
        "OPENAI_MODLE is set but no loaded plugin declares it (did you mean OPENAI_MODEL?) "
        f"{owner}; it is ignored",
    ]


# --- what plugin authors get: composition, state, single-file plugins, fixtures --------------


class Guarded:
    """A backend plugin that wraps another registered backend, chosen by name."""

    @hookimpl
    def register_settings(self, register):
        register(Setting("GUARD_INNER_BACKEND", "scripted", str, "Backend the guard wraps."))

    @hookimpl
    def register_llm_backends(self, register):
        def make_guard(settings, backends):
            inner = backends.create(settings["GUARD_INNER_BACKEND"], settings)
            inner.description = f"guarded {inner.description}"
            return inner

        register("guard", make_guard)


class Scripted:
    @hookimpl
    def register_llm_backends(self, register):
        from agentik.core.testing import ScriptedLLM

        register("scripted", lambda settings: ScriptedLLM(["inner answer"]))


def test_a_backend_wraps_another_registered_backend_by_name():
    plugins = test_plugins([("guard", Guarded()), ("scripted", Scripted())], builtins=[])
    llm = select_llm(plugins, load_settings(plugins, {"AGENTIK_LLM_BACKEND": "guard"}))
    assert llm.description == "guarded scripted" and llm.steps == [["inner answer"]]
    looping = load_settings(
        plugins, {"AGENTIK_LLM_BACKEND": "guard", "GUARD_INNER_BACKEND": "guard"}
    )
    with pytest.raises(
        StartupError, match="llm backends wrap each other in a loop: guard -> guard"
    ):
        select_llm(plugins, looping)


DICE = '''
from agentik import hookimpl
from agentik.core.settings import Setting, parse_positive_int
from agentik.core.tools import ToolError, tool


@hookimpl
def register_settings(register):
    register(Setting("DICE_MAX_SIDES", 100, parse_positive_int, "Largest die."))


@hookimpl
def register_tools(register, settings):
    @tool
    def roll(sides: int) -> str:
        """Roll a die."""
        if sides > settings["DICE_MAX_SIDES"]:
            raise ToolError(f"at most {settings['DICE_MAX_SIDES']} sides")
        return str(sides)

    register(roll)
'''


def test_single_file_plugins_from_agentik_plugins_dir(tmp_path):
    import json

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "dice.py").write_text(DICE)
    (folder / "broken.py").write_text("raise RuntimeError('half written')")
    (folder / "notes.txt").write_text("not a plugin")
    env = {"AGENTIK_LOAD_PLUGINS": "none", "AGENTIK_PLUGINS_DIR": str(folder)}
    plugins = make_plugins(env=env)
    assert plugins.infos["dice"].status == "ok"
    assert plugins.infos["dice"].hooks == ["register_settings", "register_tools"]
    assert plugins.infos["broken"].status == "failed"
    assert "half written" in plugins.infos["broken"].error
    assert "notes" not in plugins.infos
    assert load_settings(plugins, {"DICE_MAX_SIDES": "20"})["DICE_MAX_SIDES"] == 20
    listing = run_cli(tmp_path, "plugins", "--json", **env)
    report = {p["name"]: p for p in json.loads(listing.stdout)["plugins"]}
    assert report["dice"]["dist"] == str(folder / "dice.py")
    assert [s["name"] for s in report["dice"]["settings"]] == ["DICE_MAX_SIDES"]
    text = run_cli(tmp_path, "plugins", **env).stdout
    assert f"dice ({folder / 'dice.py'}) [ok]" in text
    missing = run_cli(tmp_path, "serve", AGENTIK_PLUGINS_DIR=str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert "AGENTIK_PLUGINS_DIR=" in missing.stderr and "is not a folder" in missing.stderr


async def test_the_pytest_plugin_fixtures_run_a_plugin_like_an_author_would(
    agentik_agent, scripted_llm
):
    """agentik_agent / scripted_llm come from agentik's pytest11 entry point, not conftest."""
    import importlib.util

    from agentik.core.llm import ToolCallRequest
    from agentik.core.testing import run_turn

    spec = importlib.util.spec_from_loader("dice_fixture_test", loader=None)
    dice = importlib.util.module_from_spec(spec)
    exec(DICE, dice.__dict__)
    scripted_llm.steps = [
        [ToolCallRequest("c1", "roll", '{"sides": "six"}')],
        [ToolCallRequest("c2", "roll", '{"sides": 60}')],
        ["You rolled."],
    ]
    agent = await agentik_agent(plugins=[("dice", dice)], env={"DICE_MAX_SIDES": "20"})
    turn = await run_turn(agent, "roll a d6")
    results = [e.text for e in turn.events if e.type == "ToolResult"]
    assert results == [
        "Error: invalid arguments for roll: sides: 'six' is not of type 'integer'",
        "Error: at most 20 sides",
    ]
    assert turn.text == "You rolled."
    assert [m.kind for m in turn.history][-1] == "assistant"
    assert agent.state == {}  # the documented per-app place for plugin state starts empty


async def test_the_fixtures_select_a_backend_by_name_and_it_can_wrap_the_script(
    agentik_agent, scripted_llm
):
    """Issue #28 (9): agentik_agent ignored AGENTIK_LLM_BACKEND; the test's scripted LLM is now
    also the backend ``scripted``, so a wrapping backend chosen by name wraps the script."""
    from agentik.core.testing import run_turn

    scripted_llm.steps = [["wrapped answer"]]
    agent = await agentik_agent(
        plugins=[("guard", Guarded())],
        env={"AGENTIK_LLM_BACKEND": "guard", "GUARD_INNER_BACKEND": "scripted"},
    )
    assert agent.llm is scripted_llm and agent.llm.description == "guarded scripted"
    assert (await run_turn(agent, "hi")).text == "wrapped answer"
    with pytest.raises(
        StartupError, match=r"AGENTIK_LLM_BACKEND='nope'.*available: guard, scripted"
    ):
        await agentik_agent(plugins=[("guard", Guarded())], env={"AGENTIK_LLM_BACKEND": "nope"})
