"""`messenger dashboard --login`: try the deployed dashboard's sign-in, viewer and operator,
on your machine.

Deployed, the load balancer signs the user in and adds `x-amzn-oidc-data`, an ES256 token it
signs, to every request; the app verifies it (`messenger.tools.dashboard.auth.AlbIdentity`).
Here `LocalLogin` plays the load balancer: a page at /local-login lets you pick a user (an
operator, a viewer, or an operator whose provider says the e-mail is not verified); your choice
is a signed token in an HttpOnly, SameSite=Strict cookie; every request then reaches the app with
that token in `x-amzn-oidc-data` (a header the browser sent is dropped, as the load balancer
drops it), and the app verifies it exactly as deployed: signature by key id, signer, client,
expiry, groups. The key is made when the process starts and served at /local-login/keys/<kid>
(the key endpoint's part). What it does not reproduce: the identity provider (no password,
no MFA) and the load balancer's session cookie; the token lasts TOKEN_SECONDS, then sign in again.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from messenger.tools.dashboard.auth import IDENTITY_HEADER, AlbIdentity

#: The load balancer and app client the local tokens name (the app checks both).
LOCAL_ALB_ARN = ("arn:aws:elasticloadbalancing:local:000000000000:loadbalancer/app/"
                 "messenger-local/0000000000000000")
LOCAL_CLIENT_ID = "messenger-local"
#: The group that makes an operator, and the claim holding the groups.
OPERATOR_GROUP = "operators"
GROUPS_CLAIM = "groups"
COOKIE = "messenger-local-login"
#: Seconds a local sign-in lasts.
TOKEN_SECONDS = 3600
PAGE = "/local-login"
KEYS = "/local-login/keys/"

#: The users one may sign in as: claims as a provider's userinfo would carry them.
USERS: dict[str, dict[str, Any]] = {
    "operator": {"sub": "local-operator-1", "email": "operator@example.com",
                 "email_verified": "true", GROUPS_CLAIM: f"{OPERATOR_GROUP},readers"},
    "viewer": {"sub": "local-viewer-1", "email": "viewer@example.com",
               "email_verified": "true", GROUPS_CLAIM: "readers"},
    "unverified-operator": {"sub": "local-operator-2", "email": "new-operator@example.com",
                            "email_verified": "false", GROUPS_CLAIM: OPERATOR_GROUP},
}


def _b64(data: bytes) -> str:
    # The load balancer's tokens keep base64's '=' padding.
    return base64.urlsafe_b64encode(data).decode()


@dataclass
class LocalLogin:
    """Signs local users' tokens as a load balancer does and serves its public key (module
    doc). port / host: the dashboard's (the key URL is on it)."""

    port: int
    host: str = "127.0.0.1"
    kid: str = field(default_factory=lambda: str(uuid.uuid4()))
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1()), repr=False)

    @property
    def key_url(self) -> str:
        return f"http://{self.host}:{self.port}{KEYS}{{kid}}"

    def identity(self) -> AlbIdentity:
        """The verifier the app uses: the deployed one, trusting this signer only."""
        return AlbIdentity("local", LOCAL_ALB_ARN, LOCAL_CLIENT_ID, frozenset({OPERATOR_GROUP}),
                           groups_claim=GROUPS_CLAIM, key_url=self.key_url)

    def token(self, claims: dict[str, Any], expires_in: float = TOKEN_SECONDS) -> str:
        expires = int(time.time() + expires_in)
        header = {"typ": "JWT", "alg": "ES256", "kid": self.kid, "signer": LOCAL_ALB_ARN,
                  "iss": "messenger-local", "client": LOCAL_CLIENT_ID, "exp": expires}
        body = {"iss": "messenger-local", "exp": expires, **claims}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(body).encode())}"
        der = self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def wrap(self, app: ASGIApp, allowed_hosts: set[str]) -> ASGIApp:
        """`app` behind the local load balancer; allowed_hosts: the dashboard's own hosts (a
        sign-in posted from another site, its Origin not one of them, is refused)."""
        return _LoadBalancer(app, self, allowed_hosts)


class _LoadBalancer:
    """The load balancer's part (module doc): the sign-in page, the key, the header."""

    def __init__(self, app: ASGIApp, login: LocalLogin, allowed_hosts: set[str]) -> None:
        self.app = app
        self.login = login
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == f"{KEYS}{self.login.kid}" and method == "GET":
            await _respond(send, 200, self.login.public_pem(), "application/x-pem-file")
            return
        if path == PAGE:
            origin = dict(scope.get("headers") or []).get(b"origin", b"").decode("latin-1")
            if method == "POST" and origin and \
                    origin.removeprefix("http://") not in self.allowed_hosts:
                await _respond(send, 403, f"sign-in from another site ({origin!r})".encode(),
                               "text/plain; charset=utf-8")
            elif method == "POST":
                await self._sign_in(receive, send)
            else:
                await _respond(send, 200, _page().encode(), "text/html; charset=utf-8")
            return
        headers = [(k, v) for k, v in scope.get("headers") or []
                   if k.lower() != IDENTITY_HEADER.encode()]  # never the browser's own
        cookies = cookie_parser(next((v.decode("latin-1") for k, v in headers
                                      if k.lower() == b"cookie"), ""))
        token = cookies.get(COOKIE, "")
        if not token:
            if method == "GET":
                await _respond(send, 303, b"", "text/plain", [(b"location", PAGE.encode())])
            else:
                await _respond(send, 401, b"not signed in: open /local-login", "text/plain")
            return
        headers.append((IDENTITY_HEADER.encode(), token.encode("latin-1")))
        await self.app({**scope, "headers": headers}, receive, send)

    async def _sign_in(self, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body") or len(body) > 4096:
                break
        form = parse_qs(body.decode("latin-1"))
        user = (form.get("user") or [""])[0]
        if user == "sign-out":
            cookie = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        elif user in USERS:
            token = self.login.token({**USERS[user], "nonce": secrets.token_hex(4)})
            cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={TOKEN_SECONDS}"
        else:
            await _respond(send, 400, f"user must be one of {', '.join(USERS)}, got "
                                      f"{user!r}".encode(), "text/plain; charset=utf-8")
            return
        await _respond(send, 303, b"", "text/plain", [(b"location", b"/"),
                                                      (b"set-cookie", cookie.encode())])


async def _respond(send: Send, status: int, body: bytes, kind: str,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    start: Message = {"type": "http.response.start", "status": status, "headers": [
        (b"content-type", kind.encode()), (b"content-length", str(len(body)).encode()),
        *(extra or [])]}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def _page() -> str:
    rows = "".join(
        f'<li><button type="submit" name="user" value="{escape(name)}" id="as-{escape(name)}">'
        f'Sign in as {escape(name)}</button> <span class="muted">{escape(claims["email"])}, '
        f'groups {escape(claims[GROUPS_CLAIM])}, email_verified {claims["email_verified"]}'
        f'</span></li>' for name, claims in USERS.items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Local sign-in'
        '</title></head><body><main>'
        "<h1>Local sign-in</h1><p>Plays the load balancer's part: the app verifies the signed "
        "identity header as deployed (docs/dashboard.md, Try the login locally).</p>"
        f'<form method="post" action="{PAGE}"><ul>{rows}</ul>'
        '<p><button type="submit" name="user" value="sign-out" id="sign-out">Sign out'
        "</button></p></form></main></body></html>")
