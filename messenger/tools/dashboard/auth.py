"""Who is asking: the identity behind a dashboard request, and what their role lets them do.

Deployed (`stacks/dashboard_service.py`), an Application Load Balancer authenticates every
request (`authenticate-cognito` or `authenticate-oidc`) and forwards it with the header
`x-amzn-oidc-data`: a JWT the load balancer signs with ES256, naming in its header the key
(`kid`), the load balancer (`signer`, its ARN) and the app client (`client`). `AlbIdentity`
verifies that header on every request, whatever the network in front looks like:

- the signature, with the public key the load balancer's region publishes at
  `https://public-keys.auth.elb.<region>.amazonaws.com/<kid>` (fetched once per key id);
- `signer` is this dashboard's load balancer (a token of another ALB of the account is refused),
  `client` its app client (the audience), and `exp` is in the future.

No header, or one failing any check, is a 401 and nothing is served. The role comes from the
identity provider's groups claim (`groups_claim`, e.g. `cognito:groups` or `custom:groups`; a list
or a comma/space separated string): a member of one of `operator_groups` is an operator, anyone
else a viewer, who reads everything and may act on nothing.

Locally (`messenger dashboard`) there is no login: the user is `LOCAL_OPERATOR`, as before.
"""

from __future__ import annotations

import enum
import re
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

#: The header the load balancer adds after authenticating (ES256 JWT it signs itself).
IDENTITY_HEADER = "x-amzn-oidc-data"
#: Where a region's load balancers publish their public keys (by key id).
ALB_KEY_URL = "https://public-keys.auth.elb.{region}.amazonaws.com/{kid}"
#: Key ids are UUIDs: anything else never reaches the key URL (matched whole: `fullmatch`, so
#: no trailing newline slips through as `$` would let it).
KID_PATTERN = re.compile(r"[A-Za-z0-9-]{1,128}")
#: Clock skew tolerated on `exp` (seconds).
LEEWAY_SECONDS = 30
#: Seconds a key fetch may take.
KEY_FETCH_TIMEOUT = 5.0
#: Key ids the endpoint could not give are remembered this long (seconds), at most
#: MISSING_KEYS_MAX of them (the oldest forgotten first): a run of tokens naming an unknown key
#: makes one fetch, not one per request, and a slow key endpoint stalls one refusal, not all.
MISSING_KEY_TTL = 300.0
MISSING_KEYS_MAX = 1024
#: Claims tried, in order, for the name an action is recorded under.
NAME_CLAIMS = ("email", "preferred_username", "username", "cognito:username", "name", "sub")


class Role(str, enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Identity:
    """A signed-in user (or the local operator). name: what actions are recorded under (an
    e-mail address the provider says is not verified carries " (unverified)"). subject: the
    provider's `sub`, the stable id. email: the `email` claim as given; email_verified: False
    only when the provider says so (`email_verified` false), None when it says nothing."""

    name: str
    role: Role
    subject: str = ""
    groups: tuple[str, ...] = ()
    email: str = ""
    email_verified: bool | None = None

    @property
    def operator(self) -> bool:
        return self.role is Role.OPERATOR


#: `messenger dashboard` on loopback: whoever runs it acts with their own AWS credentials.
LOCAL_OPERATOR = Identity("local operator", Role.OPERATOR)


class Unauthenticated(Exception):
    """The request carries no valid identity (401); the message says why, in one line."""


class Forbidden(Exception):
    """The identity may not do this (403): a viewer asking for an operator's action."""


def groups_of(claims: dict[str, Any], claim: str) -> tuple[str, ...]:
    """The groups `claim` names: a JSON list, or one string of names separated by commas or
    spaces (how Cognito's custom attributes and some providers' userinfo carry them)."""
    value = claims.get(claim)
    if isinstance(value, str):
        return tuple(g for g in re.split(r"[,\s]+", value) if g)
    if isinstance(value, list):
        return tuple(str(g) for g in value if isinstance(g, str | int) and str(g))
    return ()


@dataclass
class AlbIdentity:
    """Verifies the load balancer's signed identity header and maps groups to roles.

    region: the load balancer's region (whose key endpoint signs its tokens). alb_arn: the
    load balancer's ARN (the token's `signer`). client_id: the IdP app client the listener
    authenticates with (the token's `client`). operator_groups: groups whose members are
    operators (empty: everyone is a viewer). groups_claim: the claim holding the groups.
    key_url: the key endpoint, `{region}` and `{kid}` filled in (tests serve their own).
    missing_key_ttl / missing_keys_max: how long, and how many, key ids the endpoint could not
    give are remembered (refused without a fetch). clock: what that time is read from.
    """

    region: str
    alb_arn: str
    client_id: str
    operator_groups: frozenset[str] = frozenset()
    groups_claim: str = "cognito:groups"
    key_url: str = ALB_KEY_URL
    leeway_seconds: int = LEEWAY_SECONDS
    missing_key_ttl: float = MISSING_KEY_TTL
    missing_keys_max: int = MISSING_KEYS_MAX
    clock: Callable[[], float] = time.monotonic
    _keys: dict[str, Any] = field(default_factory=dict, repr=False)
    #: kid -> (clock time it may be asked again, why it failed); insertion order = age
    _missing: OrderedDict[str, tuple[float, str]] = field(default_factory=OrderedDict,
                                                          repr=False)
    _fetching: dict[str, threading.Event] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.alb_arn.startswith("arn:") or not self.client_id or not self.region:
            raise ValueError("AlbIdentity needs the load balancer's ARN, the app client id and "
                             "the region")

    def identify(self, headers: Iterable[tuple[str, str]]) -> Identity:
        """The identity of a request with these (lower-case) headers; Unauthenticated when it
        has none or an invalid one."""
        values = [value for name, value in headers if name == IDENTITY_HEADER]
        if not values:
            raise Unauthenticated(f"no {IDENTITY_HEADER} header: sign in through the "
                                  f"dashboard's load balancer")
        if len(values) > 1:
            raise Unauthenticated(f"more than one {IDENTITY_HEADER} header")
        return self.verify(values[0])

    def verify(self, token: str) -> Identity:
        """The identity a load balancer's token names, once every check holds."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"unreadable identity token ({error})") from None
        if header.get("alg") != "ES256":
            raise Unauthenticated(f"identity token signed with {header.get('alg')!r}, not ES256")
        if header.get("signer") != self.alb_arn:
            raise Unauthenticated("identity token signed by another load balancer")
        if header.get("client") != self.client_id:
            raise Unauthenticated("identity token for another app client (audience)")
        kid = str(header.get("kid") or "")
        if not KID_PATTERN.fullmatch(kid):
            raise Unauthenticated("identity token without a valid key id")
        try:
            claims = jwt.decode(token, self._key(kid), algorithms=["ES256"],
                                leeway=self.leeway_seconds,
                                options={"require": ["exp"], "verify_aud": False})
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("identity token expired: reload to sign in again") from None
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"identity token refused ({error})") from None
        groups = groups_of(claims, self.groups_claim)
        operator = bool(self.operator_groups.intersection(groups))
        name = next((str(claims[c]) for c in NAME_CLAIMS if claims.get(c)), "")
        if not name:
            raise Unauthenticated("identity token names nobody (no sub)")
        email = str(claims.get("email") or "")
        verified = email_verified(claims)
        if email and name == email and verified is False:
            name = f"{email} (unverified)"
        return Identity(name, Role.OPERATOR if operator else Role.VIEWER,
                        str(claims.get("sub") or ""), groups, email=email,
                        email_verified=verified)

    def _key(self, kid: str) -> Any:
        """The public key of `kid`: fetched once; a kid the endpoint could not give is refused
        from memory for `missing_key_ttl` s; requests naming a kid being fetched wait for that
        one fetch (KEY_FETCH_TIMEOUT) rather than making their own."""
        while True:
            with self._lock:
                if kid in self._keys:
                    return self._keys[kid]
                missing = self._missing.get(kid)
                if missing is not None:
                    if self.clock() < missing[0]:
                        raise Unauthenticated(missing[1])
                    del self._missing[kid]
                fetching = self._fetching.get(kid)
                if fetching is None:
                    fetching = self._fetching[kid] = threading.Event()
                    break
            if not fetching.wait(KEY_FETCH_TIMEOUT + 1):
                raise Unauthenticated(f"the load balancer's key {kid!r} is still being fetched")
        try:
            key = self._fetch(kid)
        finally:
            with self._lock:
                del self._fetching[kid]
            fetching.set()
        return key

    def _fetch(self, kid: str) -> Any:
        url = self.key_url.format(region=self.region, kid=kid)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=KEY_FETCH_TIMEOUT) as response:  # noqa: S310
                pem = response.read(16_384)
            key = load_pem_public_key(pem)
        except (OSError, ValueError) as error:
            why = (f"the load balancer's key {kid!r} could not be read "
                   f"({type(error).__name__} after {time.monotonic() - started:.1f} s)")
            with self._lock:
                self._missing[kid] = (self.clock() + self.missing_key_ttl, why)
                while len(self._missing) > self.missing_keys_max:
                    self._missing.popitem(last=False)
            raise Unauthenticated(why) from None
        with self._lock:
            self._keys[kid] = key
        return key


def email_verified(claims: dict[str, Any]) -> bool | None:
    """The `email_verified` claim: a JSON boolean, or the string "true"/"false" (Cognito's
    userinfo sends strings); None when absent or anything else."""
    value = claims.get("email_verified")
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None
