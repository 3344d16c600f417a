"""The dashboard served for a test: `served(settings, clients)` runs the real app under uvicorn on
a free loopback port in a thread (real HTTP, real Host headers) and stops it after the block;
`start_chromium()` the headless browser of the browser tests (Debian's chromium and
chromium-driver: `make browser`), or BrowserUnavailable with the one-line reason;
`signed_in(browser, ..., claims)` the dashboard deployed-style with the browser signed in as
those claims (the load balancer's header, made by `alb_key_server`).
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
def served(settings: Settings, clients: ClientFactory, refresh: float = 5.0,
           identity: Any = None) -> Iterator[Served]:
    """identity: an `AlbIdentity` for the deployed mode (every request needs a signed header)."""
    from messenger.tools.dashboard.app import Dashboard, running

    dashboard = Dashboard(settings, clients, free_port(), refresh, identity=identity)
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


# -- the load balancer's signed identity header, made here ---------------------------------------
ALB_ARN = ("arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/"
           "dashboard/50dc6c495c0c9188")
CLIENT_ID = "dashboard-client"


def _b64(data: bytes) -> str:
    import base64

    # The load balancer's tokens keep base64's '=' padding (AWS's docs warn about it).
    return base64.urlsafe_b64encode(data).decode()


@dataclass
class AlbSigner:
    """Signs identity tokens as an ALB does (ES256, padded base64url, kid/signer/client in the
    header) and serves its public keys as a region's key endpoint does (`key_url`)."""

    kid: str
    private_key: Any
    key_url: str
    #: the paths asked of the key endpoint, in order
    fetched: list[str]
    #: cleared: the endpoint holds every answer until it is set again (a slow endpoint)
    answering: Any

    def token(self, claims: dict[str, Any], *, signer: str = ALB_ARN, client: str = CLIENT_ID,
              kid: str | None = None, key: Any = None, alg: str = "ES256",
              expires_in: float = 120.0) -> str:
        import json
        import time

        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        header = {"typ": "JWT", "alg": alg, "kid": kid or self.kid, "signer": signer,
                  "iss": "https://idp.example", "client": client,
                  "exp": int(time.time() + expires_in)}
        body = {"exp": int(time.time() + expires_in), "iss": "https://idp.example", **claims}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(body).encode())}"
        der = (key or self.private_key).sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@contextmanager
def alb_key_server() -> Iterator[AlbSigner]:
    """A local key endpoint serving one P-256 public key (PEM) at /<kid>, as
    public-keys.auth.elb.<region>.amazonaws.com does; records the paths asked (`fetched`), and
    holds its answers while `answering` (an Event, set) is cleared."""
    import threading
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    kid = str(uuid.uuid4())
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)

    fetched: list[str] = []
    answering = threading.Event()
    answering.set()

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            fetched.append(self.path)
            answering.wait(60)
            found = self.path == f"/{kid}"
            self.send_response(200 if found else 404)
            self.end_headers()
            if found:
                self.wfile.write(pem)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield AlbSigner(kid, private, f"http://127.0.0.1:{server.server_port}/{{kid}}", fetched,
                        answering)
    finally:
        answering.set()
        server.shutdown()
        server.server_close()


@contextmanager
def signed_in(browser: Any, settings: Settings, clients: ClientFactory, claims: dict[str, Any],
              refresh: float = 5.0) -> Iterator[str]:
    """The dashboard deployed-style (operators: group 'ops' of claim 'custom:groups'), the
    browser sending the load balancer's signed header for these claims on every request (over
    CDP, removed after the block): its URL."""
    from messenger.tools.dashboard.auth import AlbIdentity

    with alb_key_server() as signer:
        identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                               groups_claim="custom:groups", key_url=signer.key_url)
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {
            "x-amzn-oidc-data": signer.token(claims, expires_in=900)}})
        try:
            with served(settings, clients, refresh=refresh, identity=identity) as dash:
                yield dash.url
        finally:
            browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
