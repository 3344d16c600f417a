"""Faster stand-ins for parts of botocore, on only for the botocore they were verified against.

Every client `messenger.aws.ClientFactory` makes can take six CPU shortcuts, each giving what
botocore gives (tests hold both side by side), together ~13-23% of a consumer's drain
(docs/fast-botocore.md), and one fix to botocore's retries:

- `signing`: `FastSigV4Auth`, botocore's SigV4 signer with cheaper headers, payload hash and key;
- `responses`: `FastParserFactory`, planned parses of SQS's receive and batch responses;
- `serialize`: `PlannedJsonSerializer`, plain JSON request bodies as `json.dumps` of the
  parameters (clients that skip parameter validation);
- `user_agent`: the User-Agent header built once per set of feature ids;
- `form_body`: a query-protocol (SNS) body url-encoded once instead of twice;
- `headers`: response headers parsed without the email package (`FastHTTPResponse`, on the
  client's own connections only; also checks the standard library code it relies on);
- `retries`: `bound_retries`, botocore's own retries (throttled or 5xx responses, broken
  attempts) held to the retry budget's deadline: none past it, no backoff sleeping past it,
  botocore's retry quota kept (off, `messenger.aws` stops them past the deadline with public
  hooks only, without capping a backoff already chosen).

They reach into botocore's private code, so they switch on (`FastPaths.from_env`) only when the
installed botocore is exactly `VERIFIED_BOTOCORE` (the pin in requirements.txt); with any other
botocore every client is plain botocore and one INFO line says why. `MESSENGER_FAST_BOTOCORE=0`
turns them off, `=1` on with any botocore. The modules holding them are imported only when they
are on: a botocore that renamed what they use cannot break an import.

The private botocore names they rely on (tests/unit/test_fastboto_pins.py keeps a hash of the
source of each function and class, so an upgrade that changes one fails the suite naming it):

- botocore.auth.SigV4Auth.headers_to_sign, botocore.auth.SigV4Auth.payload,
  botocore.auth.SigV4Auth.signature: replaced by `FastSigV4Auth`'s
- botocore.auth.SigV4Auth.add_auth, botocore.auth.SigV4Auth.canonical_headers,
  botocore.auth.SigV4Auth.signed_headers: read what the replaced methods give
- botocore.auth.SigV4Auth._is_streaming_checksum_payload,
  botocore.auth.SigV4Auth._should_sha256_sign_payload, botocore.auth._host_from_url: called
- botocore.auth.SigV4Auth.__init__: sets the `_region_name` and `_service_name` read
- botocore.auth.SIGNED_HEADERS_BLACKLIST: read
- botocore.auth.AUTH_TYPE_MAPS: `FastSigV4Auth` registered in it (used only while its `v4` is
  botocore's `SigV4Auth`: with awscrt installed it is not, and botocore signs)
- botocore.signers.RequestSigner.get_auth_instance: wrapped per client (through the client's
  `_request_signer`); botocore.signers.RequestSigner.sign: names the signature version
- botocore.awsrequest.AWSRequestPreparer._prepare_body: the body the payload hash and
  `form_body` reproduce
- botocore.parsers.JSONParser (`_handle_json_body` replaced, `_do_parse`),
  botocore.parsers.BaseJSONParser (`_handle_structure`, `_handle_map`, `_handle_blob`,
  `_handle_timestamp`, `_parse_body_as_json`), botocore.parsers.ResponseParser._parse_shape,
  botocore.parsers.ResponseParser._handle_list, botocore.parsers.ResponseParser._default_handle:
  what a parse plan reproduces and calls
- botocore.parsers.ResponseParserFactory (`create_parser`, `_defaults`), registered as the
  session's `response_parser_factory` component, which botocore.session.Session.create_client
  reads
- botocore.serialize.JSONSerializer (`_serialize` replaced, the walk over the input shape that
  a planned body reproduces), botocore.serialize.Serializer.__init__ (`_timestamp_precision`)
- botocore.client.BaseClient.__init__ (sets `_request_signer`, `_serializer`,
  `_user_agent_creator`), botocore.client.BaseClient._convert_to_request_dict (reads
  `_serializer`, calls `_user_agent_creator.to_string`)
- botocore.useragent.UserAgentString.to_string: replaced per client;
  botocore.useragent.UserAgentString._build_feature_metadata,
  botocore.useragent.UserAgentString.rebuild_and_replace_user_agent_handler: read or call it
- botocore.context.get_context, botocore.context.ClientContext: the request's feature ids
- headers: botocore.httpsession.URLLib3Session.__init__ (its `_pool_classes_by_scheme`, the
  dict its pool managers share, replaced per client), botocore.endpoint.Endpoint.__init__ (the
  client's `_endpoint.http_session`), botocore.awsrequest.AWSConnection (keeps the class's
  `response_class`), botocore.awsrequest.AWSHTTPConnectionPool,
  botocore.awsrequest.AWSHTTPSConnectionPool (subclassed); the standard library's
  http.client.HTTPResponse.begin, http.client.parse_headers, http.client._read_headers and the
  email parser's `_parsegen`, `_parse_headers` and compat32 `_policybase` (the message's
  `_headers` and `_payload`), checked by `headers.stdlib_fingerprint` instead
- retries: botocore.retries.standard.register_retry_handler (registers
  `RetryHandler.needs_retry` under the unique id `retry-config-<service>`, which
  botocore.client.ClientCreator._register_v2_standard_retries calls),
  botocore.retries.standard.RetryHandler (the handler wrapped),
  botocore.endpoint.Endpoint._needs_retry (the first non-None answer: None or False, no
  retry; a number, sleep then retry), botocore.endpoint.Endpoint._send_request (the error
  raised when it stops retrying), botocore.hooks.HierarchicalEmitter (its
  `_unique_id_handlers` read), botocore.hooks.EventAliaser (its `_emitter`, the client's
  emitter)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import botocore

from messenger.errors import InvalidSettings

#: The botocore the fast paths were verified against: requirements.txt pins the same one
#: (a test checks), and the source pins hold its code.
VERIFIED_BOTOCORE = "1.44.5"
#: '0': plain botocore; '1': the fast paths with any botocore; unset (or empty): on for
#: VERIFIED_BOTOCORE only.
ENV_VAR = "MESSENGER_FAST_BOTOCORE"
SWITCH_VALUES = ("0", "1")

logger = logging.getLogger("messenger.fastboto")
_told: set[str] = set()
_told_lock = threading.Lock()


@dataclass(frozen=True)
class FastPaths:
    """Whether clients take the fast paths (`on`), and why (`reason`, one line)."""

    on: bool
    reason: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FastPaths:
        """Decided from MESSENGER_FAST_BOTOCORE (0, 1 or unset) and the installed botocore;
        any other value raises `InvalidSettings`. The decision is logged once per process
        (INFO when off, WARNING when forced on for an unverified botocore)."""
        env = os.environ if environ is None else environ
        value = env.get(ENV_VAR, "").strip()
        installed = botocore.__version__
        verified = installed == VERIFIED_BOTOCORE
        if value not in ("", *SWITCH_VALUES):
            raise InvalidSettings(
                f"{ENV_VAR} must be 0 (plain botocore) or 1 (the fast paths with any botocore), "
                f"or unset (the fast paths with botocore {VERIFIED_BOTOCORE} only), "
                f"got {value!r}")
        if value == "0":
            found = cls(False, f"fast botocore paths off: {ENV_VAR}=0")
        elif value == "1":
            found = cls(True, f"fast botocore paths on: {ENV_VAR}=1" + (
                "" if verified else
                f", with botocore {installed} (verified against {VERIFIED_BOTOCORE} only)"))
        elif verified:
            found = cls(True, f"fast botocore paths on: botocore {installed} is the verified one")
        else:
            found = cls(False, f"fast botocore paths off: botocore {installed} is installed, "
                               f"they were verified against {VERIFIED_BOTOCORE} only "
                               f"({ENV_VAR}=1 forces them on)")
        found._tell(forced_unverified=value == "1" and not verified)
        return found

    def _tell(self, forced_unverified: bool) -> None:
        with _told_lock:
            if self.reason in _told:
                return
            _told.add(self.reason)
        level = logging.WARNING if forced_unverified else (
            logging.DEBUG if self.on else logging.INFO)
        logger.log(level, self.reason)


def prepare_session(session: Any) -> None:
    """Have a botocore session's clients (made after) parse responses with the planned parser."""
    from messenger.fastboto.responses import FastParserFactory

    session.register_component("response_parser_factory", FastParserFactory())


def speed_up(client: Any, planned_bodies: bool) -> None:
    """Put a botocore client on the fast paths: SNS bodies encoded once, the User-Agent kept,
    the cheaper signer, response headers parsed without the email package and
    (`planned_bodies`: a client that skips parameter validation) planned JSON request bodies.
    Each one that finds botocore not as it expects leaves it alone."""
    from messenger.fastboto.form_body import encode_form_once
    from messenger.fastboto.headers import use_fast_headers
    from messenger.fastboto.serialize import use_planned_serializer
    from messenger.fastboto.signing import use_fast_signing
    from messenger.fastboto.user_agent import reuse_user_agent

    client.meta.events.register("before-sign", encode_form_once)
    reuse_user_agent(client)
    use_fast_signing(client)
    use_fast_headers(client)
    if planned_bodies:
        use_planned_serializer(client)


def bound_retries(client: Any, deadline: Callable[[], float | None]) -> bool:
    """Hold a botocore client's own retries to `deadline()` (monotonic seconds, None: none):
    no retry once it has passed, no backoff past it (`messenger.fastboto.retries`). True when
    they now are; a client whose retry handler is not found as expected is left alone."""
    from messenger.fastboto.retries import bound_retries as bound

    return bound(client, deadline)
