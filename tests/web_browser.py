"""Debian's Chromium driven by Selenium through ``/usr/bin/chromedriver`` (nothing is
downloaded), and :class:`Page`, what a person does with the web page. Used by
``tests/test_web_e2e.py`` and ``bench/b24_web_page.py``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "web-artifacts"
WAIT = 15.0
OWN_KEY = object()


def have_chromium() -> bool:
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


def chromium(profile: Path, width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium with a fresh profile (the flags that work as root, offline)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    return driver


class Page:
    """The page in the browser, and what a person does with it."""

    def __init__(self, driver: Any, base: str, key: str | None = None) -> None:
        self.d = driver
        self.base = base
        self.key = key

    def load(self, key: Any = OWN_KEY, path: str = "/") -> Page:
        """Open the page in a fresh tab state, with ``key`` (the page's own by default) already
        given for the tab; ``key=None``: the page will ask."""
        key = self.key if key is OWN_KEY else key
        self.d.set_window_size(1280, 900)
        self.d.get(f"{self.base}/health")  # same origin: set the tab's key before the page runs
        self.d.execute_script(
            "sessionStorage.clear(); localStorage.clear();"
            "if (arguments[0]) sessionStorage.setItem('agentik.key', arguments[0]);",
            key,
        )
        self.d.get(self.base + path)
        self.until(lambda: self.js("return document.readyState") == "complete")
        return self

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def until(self, check: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                value = check()
                if value:
                    return value
            if time.monotonic() > deadline:
                self.shot("timeout")
                log = [e["message"] for e in self.d.get_log("browser")]
                log += self.js(  # the requests that completed (an open stream is not listed)
                    "return performance.getEntriesByType('resource')"
                    ".map(e => `${e.name} ${Math.round(e.startTime)}-${Math.round(e.responseEnd)}`)"
                )
                raise AssertionError(
                    f"timed out waiting for {what or check}; the page:\n" + "\n".join(log)
                )
            time.sleep(0.05)

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.d.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return str(
            self.js(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css
            )
        )

    def type(self, text: str, enter: bool = True) -> None:
        from selenium.webdriver.common.keys import Keys

        box = self.find("#composer-text")
        box.send_keys(text + (Keys.ENTER if enter else ""))

    def new_chat(self) -> str:
        before = self.js("return location.hash")
        self.find("#new-chat").click()
        self.until(lambda: self.js("return location.hash") not in ("", before), what="a new chat")
        return str(self.js("return decodeURIComponent(location.hash.slice(1))"))

    def replies(self) -> list[str]:
        return list(
            self.js("return [...document.querySelectorAll('.turn .reply')].map(e => e.innerText)")
        )

    def wait_idle(self) -> None:
        self.wait_idle_for(WAIT)

    def wait_idle_for(self, timeout: float) -> None:
        self.until(lambda: not self.find("#stop").is_displayed(), timeout, what="the turn to end")

    def item_button(self, cid: str, label: str) -> None:
        """Click a button of a conversation in the list (shown on hover or focus); the list
        is redrawn when the agent's events say something changed, so try again if it was."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.action_chains import ActionChains

        for _ in range(50):
            try:
                item = self.find(f'#conversations li[data-id="{cid}"]')
                ActionChains(self.d).move_to_element(item).perform()
                [button] = [
                    b for b in item.find_elements("css selector", "button") if b.text == label
                ]
                button.click()
                return
            except StaleElementReferenceException:
                time.sleep(0.1)
        raise AssertionError(f"no {label} button for {cid}")

    def shot(self, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        self.d.save_screenshot(str(path))
        return path

    def errors(self) -> list[str]:
        """Errors the page logged (CSP violations included), but the 401s the key flow and
        the favicon of /health cause."""
        return [
            e["message"]
            for e in self.d.get_log("browser")
            if e["level"] == "SEVERE" and "(Unauthorized)" not in e["message"]
        ]
