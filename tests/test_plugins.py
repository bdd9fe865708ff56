"""Plugin discovery and selection: entry points, failures, switches, the registry, settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentik.core.app import StartupError, load_settings, registries, select_llm
from agentik.core.plugins import make_plugins
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
        assert (info.status, info.dist) == ("ok", "agentik")
        assert info.hooks
    assert plugins.infos["agentik.core"].status == "ok"


def test_a_plugin_that_fails_to_import_is_reported_and_skipped(tmp_path, monkeypatch):
    install_fake_dist(tmp_path, monkeypatch, "agentik_broken", "raise ImportError('no numpy')")
    plugins = make_plugins(env={})
    info = plugins.infos["agentik_broken"]
    assert info.status == "failed" and "no numpy" in info.error
    assert plugins.infos["agentik_transport_http"].status == "ok"
    with pytest.raises(ImportError, match="no numpy"):
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
    by_dist = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "agentik"})
    assert by_dist.infos["agentik_llm_openai"].status == "ok"


class Dummy:
    def __init__(self, name: str, aliases=()) -> None:
        self.name, self.aliases = name, aliases

    @hookimpl
    def register_llm_backends(self, register):
        register(self.name, lambda settings: None, aliases=self.aliases)


def test_duplicate_backend_names_are_an_error_naming_both_plugins():
    plugins = test_plugins([("plugin_a", Dummy("same")), ("plugin_b", Dummy("other", ["same"]))])
    with pytest.raises(BackendError, match="plugin_a and plugin_b"):
        registries(plugins)


def test_unknown_backend_lists_the_available_ones():
    plugins = test_plugins([("plugin_a", Dummy("alpha"))], builtins=["agentik_llm_openai"])
    settings = load_settings(plugins, {"AGENTIK_LLM_BACKEND": "gamma"})
    with pytest.raises(StartupError, match=r"AGENTIK_LLM_BACKEND='gamma'.*alpha, openai"):
        select_llm(plugins, settings)


def test_a_backend_whose_extra_is_missing_says_what_to_install():
    reg = BackendRegistry("llm")
    reg.register_for("p")("fancy", lambda s: None, requires=("no_such_module_xyz",), extra="fancy")
    with pytest.raises(
        BackendError, match=r"needs no_such_module_xyz; pip install 'agentik\[fancy\]'"
    ):
        reg.get("fancy", variable="AGENTIK_LLM_BACKEND")


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


def test_builtin_plugins_import_no_heavy_module():
    code = (
        "import sys, agentik.core.cli, agentik_llm_openai, agentik_transport_http,"
        " agentik_tools_mcp, agentik_llm_litert;"
        "from agentik.core.plugins import make_plugins; make_plugins();"
        "heavy = [m for m in ('openai', 'httpx2', 'pydantic', 'mcp', 'litert_lm')"
        " if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_third_party_plugin_installs_and_is_selectable(tmp_path):
    """pip-install examples/agentik-llm-echo into a throwaway venv and use it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # agentik and its dependencies come from this environment; the plugin is installed for real
    ours = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "parent_env.pth").write_text("\n".join(ours) + "\n")
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


def test_trace_plugins_logs_hook_calls(caplog):
    import logging

    from agentik.core.app import collect_prompt_sections

    caplog.set_level(logging.INFO, logger="agentik.plugins.trace")
    plugins = make_plugins(env={"AGENTIK_TRACE_PLUGINS": "1", "AGENTIK_LOAD_PLUGINS": "none"})
    collect_prompt_sections(plugins, load_settings(plugins, {}))
    lines = [r.getMessage() for r in caplog.records]
    assert "register_prompt_sections(register, settings) -> [agentik.core]" in lines
    assert "register_prompt_sections returned []" in lines
    caplog.clear()
    quiet = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "none"})
    collect_prompt_sections(quiet, load_settings(quiet, {}))
    assert not caplog.records  # off unless asked
