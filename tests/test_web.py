"""The web page's server side (plugin ``agentik_transport_web``): its files are public and
carry a Content-Security-Policy of their own origin, its data is not, its path is configurable,
and it stays small. The page itself is tested in Chromium (tests/test_web_e2e.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentik.core.app import create_app
from agentik.core.settings import SettingsError
from agentik.core.testing import EchoLLM, make_app
from agentik_transport_web import parse_page_path
from agentik_transport_web.routes import CSP

KEY = "web-test-key-0123456789"
STATIC = Path(__file__).resolve().parent.parent / "plugins" / "transport_web" / "static"
WEB = ("agentik_transport_http", "agentik_transport_web")


def app(tmp_path, **env):
    return make_app(env={"AGENTIK_DB_PATH": str(tmp_path / "web.db"), **env}, builtins=WEB)


async def test_the_page_loads_without_the_key_and_the_data_needs_it(aiohttp_client, tmp_path):
    client = await aiohttp_client(app(tmp_path, AGENTIK_API_KEY=KEY))
    page = await client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
    html = await page.text()
    assert '<script type="module" src="assets/app.js">' in html
    for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css")]:
        r = await client.get(f"/assets/{name}")
        assert r.status == 200 and r.content_type == kind, name
        assert r.headers["Content-Security-Policy"] == CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Content-Security-Policy"] == CSP
    assert "default-src 'none'" in CSP and "script-src 'self'" in CSP
    assert "connect-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    assert not re.search(r"https?:|\*|'unsafe", CSP)  # only this origin, no inline code
    r = await client.get("/agentik/conversations")
    assert r.status == 401
    r = await client.get("/agentik/conversations", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status == 200


async def test_files_are_revalidated_and_unknown_ones_are_404(aiohttp_client, tmp_path):
    client = await aiohttp_client(app(tmp_path))
    first = await client.get("/assets/app.js")
    etag = first.headers["ETag"]
    assert first.headers["Cache-Control"] == "no-cache"
    again = await client.get("/assets/app.js", headers={"If-None-Match": etag})
    assert again.status == 304 and again.headers["Content-Security-Policy"] == CSP
    for name in ["nope.js", "index.html", "..%2Fsetup.cfg", "%2e%2e%2f__init__.py"]:
        r = await client.get(f"/assets/{name}")
        assert r.status == 404, name
        assert (await r.json())["error"]["code"] == "not_found"
    assert (await client.get("/assets/../__init__.py")).status == 404


async def test_the_page_can_live_under_another_path(aiohttp_client, tmp_path):
    client = await aiohttp_client(app(tmp_path, AGENTIK_WEB_PATH="/chat"))
    r = await client.get("/chat", allow_redirects=False)
    assert r.status == 308 and r.headers["Location"] == "/chat/"
    assert (await client.get("/chat/")).status == 200
    assert (await client.get("/chat/assets/style.css")).status == 200
    assert (await client.get("/")).status == 404
    assert (await client.get("/health")).status == 200


def test_the_path_setting_refuses_what_would_clash_or_escape():
    assert parse_page_path("/") == "/"
    assert parse_page_path("/chat") == "/chat/"
    assert parse_page_path(" /a/b/ ") == "/a/b/"
    for bad in ["chat", "/agentik/web", "/health", "/a b", "/a/../b", "/x?y", "//x", "/{x}"]:
        with pytest.raises(ValueError):
            parse_page_path(bad)
    with pytest.raises(SettingsError, match="AGENTIK_WEB_PATH"):
        app(Path("/tmp"), AGENTIK_WEB_PATH="/agentik/")


async def test_off_when_the_plugin_is_disabled(aiohttp_client, tmp_path):
    env = {
        "AGENTIK_DB_PATH": str(tmp_path / "on.db"),
        "AGENTIK_MEMORY_BACKEND": "off",
        "AGENTIK_MCP_CONFIG": "off",
    }
    on = await aiohttp_client(create_app(env=env, llm=EchoLLM()))  # the installed entry points
    assert (await on.get("/")).status == 200
    env["AGENTIK_DB_PATH"] = str(tmp_path / "off.db")  # one server a database
    env["AGENTIK_DISABLE_PLUGINS"] = "agentik_transport_web"
    off = await aiohttp_client(create_app(env=env, llm=EchoLLM()))
    assert (await off.get("/")).status == 404
    assert (await off.get("/agentik/conversations")).status == 200


def test_the_page_is_small_and_asks_no_other_host():
    code = [p for p in STATIC.iterdir() if p.suffix in (".js", ".css")]
    assert sum(p.stat().st_size for p in code) <= 150 * 1024
    for path in STATIC.iterdir():
        text = path.read_text()
        # no URL of another host anywhere: no CDN, fonts, analytics (the SVG's XML namespace
        # is a name, not a request)
        urls = re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I)
        assert urls in ([], ["http://www.w3.org"]), (path.name, urls)
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, path.name
        assert "eval(" not in text and "new Function" not in text, path.name
    html = (STATIC / "index.html").read_text()
    for ref in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert ref.startswith(("assets/", "#")), ref


def test_every_module_is_preloaded_by_the_page():
    """The page names every module it imports, so the browser fetches them at once instead of
    discovering them import by import (a round trip each level)."""
    html = (STATIC / "index.html").read_text()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="assets/([^"]+)">', html))
    modules = {p.name for p in STATIC.glob("*.js")} - {"app.js"}
    assert preloaded == modules
