"""The dashboard served for a test: `served(settings, clients)` runs the real app under uvicorn on
a free loopback port in a thread (real HTTP, real Host headers) and stops it after the block;
`start_chromium()` the headless browser of the browser tests (Debian's chromium and
chromium-driver: `make browser`), or BrowserUnavailable with the one-line reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from messenger.aws import ClientFactory
from messenger.settings import Settings

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Set in CI (.ci/run): a missing browser fails the browser tests instead of skipping them.
REQUIRE_VARIABLE = "MESSENGER_REQUIRE_BROWSER"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1200,900",
)


@dataclass
class Served:
    url: str
    port: int
    token: str
    dashboard: Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def served(settings: Settings, clients: ClientFactory, refresh: float = 5.0) -> Iterator[Served]:
    from messenger.tools.dashboard.app import Dashboard, running

    dashboard = Dashboard(settings, clients, free_port(), refresh)
    with running(dashboard) as url:
        yield Served(url, dashboard.port, dashboard.token, dashboard)


class BrowserUnavailable(Exception):
    """No headless browser here; the message is the one line saying why."""


def start_chromium() -> Any:
    """A Selenium Chrome driver on /usr/bin/chromium with a fresh profile (removed at quit)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise BrowserUnavailable(f"{path} missing: make browser (apt-get install chromium "
                                     f"chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserUnavailable("selenium missing: pip install -r requirements.txt") from None
    profile = tempfile.mkdtemp(prefix="messenger-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except Exception as error:  # noqa: BLE001 - any start failure is "no browser here"
        shutil.rmtree(profile, ignore_errors=True)
        raise BrowserUnavailable(f"chromium did not start: {str(error).splitlines()[0]}") from None
    original_quit = driver.quit

    def quit_and_clean() -> None:
        original_quit()
        shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean
    return driver
