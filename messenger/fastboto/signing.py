"""A cheaper SigV4 signature, byte for byte botocore's: the same `SigV4Auth`, lighter inside.

botocore's `SigV4Auth` collects the headers to sign into an `email.message.Message` (its
`HTTPHeaders`), twice per request, and reads them back through the email package's header
policy; it prepares the whole request (headers copied) to hash its body; and it derives the
signing key (four HMACs) on every request. Together that is ~40% of signing an SQS call
(74 → 43 µs), and signing is a tenth of the call's client CPU. `FastSigV4Auth` keeps
botocore's algorithm (it is a subclass: canonical request, string to sign, headers written)
and changes only those steps: the headers to sign go into a plain dict of lists with the same
lookups (lower-cased names, values as given, `host` from the URL when absent), a body of bytes
or text is hashed as it is (what preparing it gives), and the signing key is kept per (secret,
day, region, service), as AWS's Java SDK does. tests/unit/test_signing.py compares both
signers' headers and payload hashes over a range of requests.

botocore picks the signer class by name (`botocore.auth.AUTH_TYPE_MAPS`) in its request signer's
`get_auth_instance`; `use_fast_signing` registers this class under its own name and has a
client's request signer use it where botocore would use plain `v4` (S3's, presigned URLs' and
every other signer stay botocore's). A call-level test fails if botocore stops going that way.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from functools import lru_cache
from hashlib import sha256
from typing import Any

import botocore.auth
from botocore.auth import SIGNED_HEADERS_BLACKLIST, SigV4Auth
from botocore.awsrequest import AWSRequest

#: The name `FastSigV4Auth` is registered under in botocore's signer map.
FAST_V4 = "messenger-v4"
#: The botocore signer name it stands in for.
PLAIN_V4 = "v4"

#: The host botocore signs when a request has no Host header (its own helper, kept per URL);
#: None in a botocore without it: its signer is then used as it is.
_host_from_url = getattr(botocore.auth, "_host_from_url", None)
_host_for: Callable[[str], str] | None = \
    lru_cache(maxsize=256)(_host_from_url) if _host_from_url is not None else None


class SignedHeaders:
    """The headers to sign, the way `SigV4Auth` reads them from botocore's `HTTPHeaders`:
    iteration gives the (lower-case) names, `get_all` a name's values in order, `in` ignores
    case, setting a name adds a value."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self.values

    def __setitem__(self, name: str, value: Any) -> None:
        self.values.setdefault(name.lower(), []).append(value)

    def get_all(self, name: str, failobj: Any = None) -> list[Any] | Any:
        return self.values.get(name.lower(), failobj)


@lru_cache(maxsize=32)
def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """SigV4's derived key (kDate → kRegion → kService → kSigning), as `SigV4Auth.signature`
    computes it."""
    key = hmac.new(f"AWS4{secret}".encode(), day.encode(), sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), sha256).digest()
    return key


class FastSigV4Auth(SigV4Auth):
    """botocore's SigV4 signer with a light map of the headers to sign, the body hashed without
    preparing the request, and a kept signing key."""

    def headers_to_sign(self, request: Any) -> SignedHeaders:  # type: ignore[override]
        found = SignedHeaders()
        values = found.values
        for name, value in request.headers.items():
            lower = name.lower()
            if lower not in SIGNED_HEADERS_BLACKLIST:
                values.setdefault(lower, []).append(value)
        if "host" not in values:
            assert _host_for is not None  # (use_fast_signing checked)
            values["host"] = [_host_for(request.url)]
        return found

    def payload(self, request: Any) -> str:
        # botocore reads `request.body`, which prepares the whole request (headers copied and
        # all) for the body: for bytes or text data that body is the data itself (text as
        # UTF-8), so its hash is taken from the data; anything else goes botocore's way.
        data = request.data
        if type(request) is AWSRequest and type(data) in (bytes, str) and \
                not self._is_streaming_checksum_payload(request) and \
                self._should_sha256_sign_payload(request):
            return sha256(data.encode("utf-8") if type(data) is str else data).hexdigest()
        return str(super().payload(request))

    def signature(self, string_to_sign: str, request: Any) -> str:
        key = _signing_key(self.credentials.secret_key, request.context["timestamp"][0:8],
                           self._region_name, self._service_name)
        return hmac.new(key, string_to_sign.encode("utf-8"), sha256).hexdigest()


def use_fast_signing(client: Any) -> bool:
    """Have a botocore client sign with `FastSigV4Auth` wherever it would use botocore's plain
    SigV4 signer; True when it now does. False when this botocore does not work the way it
    expects, or signs `v4` with another class (awscrt installed: its CRT signer): the client
    keeps botocore's signer."""
    signer: Any = getattr(client, "_request_signer", None)
    original = getattr(signer, "get_auth_instance", None)
    if original is None or _host_for is None or \
            botocore.auth.AUTH_TYPE_MAPS.get(PLAIN_V4) is not SigV4Auth:
        return False
    if getattr(original, "fast_signing", False):
        return True
    botocore.auth.AUTH_TYPE_MAPS.setdefault(FAST_V4, FastSigV4Auth)

    def get_auth_instance(signing_name: str, region_name: str,
                          signature_version: str | None = None, **kwargs: Any) -> Any:
        if signature_version == PLAIN_V4:  # (botocore's `sign` always names it)
            signature_version = FAST_V4
        return original(signing_name, region_name, signature_version, **kwargs)

    get_auth_instance.fast_signing = True  # type: ignore[attr-defined]
    signer.get_auth_instance = get_auth_instance
    return True
