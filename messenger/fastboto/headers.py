"""A client's HTTP response headers parsed without the email package: what http.client parses.

`http.client.HTTPResponse.begin` parses every response's header block with
`http.client.parse_headers`, which joins the lines and feeds them through `email.parser`
(feedparser, the compat32 policy, a `Message` per header block): ~110 of ~300 µs per response on
the 2-core bench machine (loaded), the largest single cost in a request's response handling.
`FastHTTPResponse.begin` is the standard library's own `begin` (the same code object, run with
`parse_headers` below in place of http.client's); `parse_headers` reads the lines with
http.client's `_read_headers` (its line and header limits), and builds the `HTTPMessage`
feedparser would build (the same `_headers` pairs, an empty payload, no defects) when every line
is a plain `name: value` line or a folded continuation of one. Any other header block (a line
feedparser would split at a bare CR or treat as a body or an envelope, a continuation first, a
multipart or message content type, no blank line at the end) goes through the email package as
before. tests/unit/test_fast_headers.py parses responses both ways side by side.

Only the connections of the clients `use_fast_headers` is given use it (their HTTP session's
pool classes are replaced with subclasses whose connection's `response_class` is
`FastHTTPResponse`): every other http.client user in the process is untouched.

It reaches into the standard library too, so it switches on only for the code it was verified
against: `stdlib_fingerprint()` (a hash of the bytecode, names and constants of the functions
below) must be one of `VERIFIED_STDLIB`, whatever MESSENGER_FAST_BOTOCORE says; otherwise the
clients keep http.client's own response class and one INFO line says why. The standard
library code relied on: http.client.HTTPResponse.begin (run as is), http.client.parse_headers
and http.client._read_headers (what `parse_headers` reproduces and calls),
email.feedparser.FeedParser._parsegen, email.feedparser.FeedParser._parse_headers,
email.feedparser.BufferedSubFile.push, email._policybase.Compat32.header_source_parse and
email.message.Message.__init__ (the message they build). The botocore names are listed in
`messenger.fastboto`'s docstring (pinned by tests/unit/test_fastboto_pins.py).
"""

from __future__ import annotations

import email.feedparser
import email.message
import email.parser
import hashlib
import http.client
import logging
import re
import threading
import types
from email._policybase import Compat32
from typing import Any, BinaryIO

from botocore.awsrequest import (
    AWSHTTPConnection,
    AWSHTTPConnectionPool,
    AWSHTTPSConnection,
    AWSHTTPSConnectionPool,
)

logger = logging.getLogger("messenger.fastboto")
#: The standard library modules whose private names this path uses (untyped in typeshed).
HTTP_CLIENT: Any = http.client
FEEDPARSER: Any = email.feedparser

#: `stdlib_fingerprint()` of the Python versions this path was checked against (CPython 3.11.7;
#: the bytecode of these functions is the same across a minor version's patch releases unless
#: their code changes).
VERIFIED_STDLIB = frozenset({
    "433058159d8c831ea21085c1ecc76fa4ba69c65b",  # CPython 3.11.7
})

#: A plain header line: a feedparser field name (printable ASCII but ':'), ':', optional blanks,
#: the value (no character that feedparser or str.splitlines would end a line at), CRLF or LF.
#: A continuation line: a blank first, the same value characters.
_PLAIN_LINE = re.compile(
    r"(?:([\041-\071\073-\176]+):[ \t]*|[ \t])[^\r\n\x0b\x0c\x1c\x1d\x1e\x85]*\r?\n\Z")
_PLAIN_ENDS = (b"\r\n", b"\n")
_KEEPS_BODY_TYPES = ("multipart", "message")


def _code_parts(code: types.CodeType) -> list[Any]:
    parts: list[Any] = [code.co_code, code.co_names, code.co_varnames]
    for constant in code.co_consts:
        parts.append(_code_parts(constant) if isinstance(constant, types.CodeType)
                     else repr(constant))
    return parts


def stdlib_fingerprint() -> str:
    """SHA-1 of the bytecode, names and constants of the standard library functions this path
    runs or reproduces (line numbers and file names left out)."""
    functions = [
        HTTP_CLIENT.HTTPResponse.begin, HTTP_CLIENT.parse_headers, HTTP_CLIENT._read_headers,
        FEEDPARSER.FeedParser._parsegen, FEEDPARSER.FeedParser._parse_headers,
        FEEDPARSER.BufferedSubFile.push, Compat32.header_source_parse,
        email.message.Message.__init__,
    ]
    parts = [_code_parts(function.__code__) for function in functions]
    parts.append([FEEDPARSER.headerRE.pattern, FEEDPARSER.NLCRE_crack.pattern])
    return hashlib.sha1(repr(parts).encode("utf-8")).hexdigest()


def plain_headers(lines: list[bytes]) -> http.client.HTTPMessage | None:
    """The `HTTPMessage` the email package makes of a header block read by `_read_headers`
    (its lines, the blank one last), or None when a line is not plain (then only the email
    package says what it makes of it)."""
    if not lines or lines[-1] not in _PLAIN_ENDS:
        return None
    pairs: list[list[str]] = []
    for raw in lines[:-1]:
        line = raw.decode("iso-8859-1")
        found = _PLAIN_LINE.match(line)
        if found is None:
            return None
        name = found.group(1)
        if name is not None:
            # compat32's header_source_parse: the value after the first ':', blanks stripped
            pairs.append([name, line[len(name) + 1:].lstrip(" \t")])
        elif pairs:  # a folded line: kept whole, line ending and leading blank included
            pairs[-1][1] += line
        else:  # a continuation first: a defect feedparser records
            return None
    headers = []
    for name, value in pairs:
        value = value.rstrip("\r\n")
        if name.lower() == "content-type" and any(
                kind in value.lower() for kind in _KEEPS_BODY_TYPES):
            return None  # feedparser looks for parts (and notes defects)
        headers.append((name, value))
    message: Any = http.client.HTTPMessage()
    message._headers = headers
    message._payload = ""
    return message  # type: ignore[no-any-return]


def parse_headers(fp: BinaryIO) -> http.client.HTTPMessage:
    """http.client.parse_headers' result, through the email package only when a line is not
    plain (`plain_headers`)."""
    lines = HTTP_CLIENT._read_headers(fp)
    message = plain_headers(lines)
    if message is not None:
        return message
    text = b"".join(lines).decode("iso-8859-1")
    return email.parser.Parser(_class=http.client.HTTPMessage).parsestr(text)


def _stdlib_begin() -> Any:
    """http.client.HTTPResponse.begin, the same code, finding `parse_headers` above instead of
    http.client's (every other global is http.client's, as they were at import)."""
    begin = http.client.HTTPResponse.begin
    names = dict(vars(http.client), parse_headers=parse_headers)
    return types.FunctionType(begin.__code__, names, begin.__name__, begin.__defaults__,
                              begin.__closure__)


class FastHTTPResponse(http.client.HTTPResponse):
    """http.client's response, its headers parsed by `parse_headers`."""

    begin = _stdlib_begin()


class FastHTTPConnection(AWSHTTPConnection):
    response_class = FastHTTPResponse


class FastHTTPSConnection(AWSHTTPSConnection):
    response_class = FastHTTPResponse


class FastHTTPConnectionPool(AWSHTTPConnectionPool):
    ConnectionCls = FastHTTPConnection


class FastHTTPSConnectionPool(AWSHTTPSConnectionPool):
    ConnectionCls = FastHTTPSConnection


_verified: list[bool] = []
_verified_lock = threading.Lock()


def stdlib_verified() -> bool:
    """Whether this Python's http.client and email code is the verified one (worked out once
    per process; INFO line when it is not)."""
    with _verified_lock:
        if not _verified:
            found = stdlib_fingerprint()
            _verified.append(found in VERIFIED_STDLIB)
            if not _verified[0]:
                logger.info("fast response headers off: this Python's http.client/email code "
                            "(fingerprint %s) is not the verified one", found)
        return _verified[0]


def use_fast_headers(client: Any) -> bool:
    """Have a botocore client's connections (made after) parse response headers with
    `parse_headers`; True when they now do. A client whose HTTP session does not hold botocore's
    own pool classes, or a Python whose http.client is not the verified one, is left alone."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    pools = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(pools, dict) or pools.get("http") is not AWSHTTPConnectionPool \
            or pools.get("https") is not AWSHTTPSConnectionPool or not stdlib_verified():
        return False
    # the same dict is the session's pool managers' (URLLib3Session.__init__ shares it)
    pools["http"] = FastHTTPConnectionPool
    pools["https"] = FastHTTPSConnectionPool
    return True
