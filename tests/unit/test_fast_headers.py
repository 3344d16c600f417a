"""Response headers parsed by messenger.fastboto.headers are what http.client parses.

Each header block is parsed both ways side by side: the `HTTPMessage` (every attribute: the
header pairs, payload, defects, policy) and, for whole responses, what `begin` sets (status,
version, chunked, length, will_close) and the body read after it.
"""

from __future__ import annotations

import http.client
import io
import logging
from typing import Any

import botocore.session
import pytest
from botocore.awsrequest import AWSHTTPConnectionPool, AWSHTTPSConnectionPool

from messenger.fastboto import headers
from messenger.fastboto.headers import (
    FastHTTPResponse,
    FastHTTPSConnectionPool,
    parse_headers,
    plain_headers,
    use_fast_headers,
)

#: Header blocks the fast parse takes (plain lines), as a server could send them.
PLAIN = {
    "sqs": b"x-amzn-RequestId: 8c1b7a3e-0f7a\r\nDate: Wed, 25 Nov 2026 18:00:00 GMT\r\n"
           b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 42\r\n"
           b"Connection: keep-alive\r\n\r\n",
    "duplicates": b"Set-Cookie: a=1\r\nset-cookie: b=2\r\nSET-COOKIE: c=3\r\nVia: 1.1 x\r\n\r\n",
    "folded": b"X-Long: first\r\n  second part\r\n\tthird\r\nX-After: y\r\n\r\n",
    "folded blank": b"X-Fold:\r\n next\r\n \r\nX-Z: z\r\n\r\n",
    "mixed case names": b"CONTENT-length: 3\r\ncOnTeNt-TyPe: text/plain\r\n\r\n",
    "bare LF": b"A: 1\nB:2\n\n",
    "blanks around values": b"A:   spaced   \r\nB:\t\ttabbed\t\r\nC:\r\nD: \r\n\r\n",
    "colons in value": b"Location: http://h:8080/a:b\r\nX::: y\r\n\r\n",
    "latin-1 value": "X-Name: caf\u00e9 \u00ff\r\n".encode("iso-8859-1") + b"\r\n",
    "symbols in name": b"X-A_b.c!#$%&'*+^`|~: v\r\n\r\n",
    "From as a name": b"From: someone\r\n\r\n",
    "no headers": b"\r\n",
}

#: Header blocks only the email package parses (the fast parse gives them to it).
UNUSUAL = {
    "continuation first": b" leading\r\nA: 1\r\n\r\n",
    "bare CR in value": b"A: 1\r2\r\nB: 3\r\n\r\n",
    "no colon": b"A: 1\r\nnot a header\r\nB: 2\r\n\r\n",
    "colon first": b": nameless\r\nA: 1\r\n\r\n",
    "space before colon": b"A : 1\r\n\r\n",
    "envelope line": b"From someone\r\nA: 1\r\n\r\n",
    "vertical tab": b"A: 1\x0b2\r\n\r\n",
    "form feed": b"A: 1\x0c2\r\n\r\n",
    "next line": b"A: 1\x852\r\n\r\n",
    "multipart": b"Content-Type: multipart/mixed; boundary=x\r\n\r\n",
    "message": b"content-type: message/rfc822\r\n\r\n",
    "non-ascii name": "N\u00e4me: v\r\n".encode("iso-8859-1") + b"\r\n",
    "no blank line (end of stream)": b"A: 1\r\nB: 2\r\n",
}


def attributes(message: http.client.HTTPMessage) -> dict[str, Any]:
    found = dict(vars(message))
    found["defects"] = [repr(defect) for defect in message.defects]
    found["items"] = message.items()
    if isinstance(message._payload, list):  # a message/* or multipart type: its parts
        found["_payload"] = [attributes(part) for part in message._payload]
    return found


def both(block: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    ours = parse_headers(io.BytesIO(block + b"body after the headers"))
    theirs = http.client.parse_headers(io.BytesIO(block + b"body after the headers"))
    assert type(ours) is type(theirs) is http.client.HTTPMessage
    return attributes(ours), attributes(theirs)


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_block_is_parsed_fast_into_what_http_client_makes(name):
    block = PLAIN[name]
    # Given a plain header block: the fast parse takes it
    assert plain_headers(http.client._read_headers(io.BytesIO(block))) is not None
    # Then the message is the email package's, attribute by attribute
    ours, theirs = both(block)
    assert ours == theirs


@pytest.mark.parametrize("name", UNUSUAL)
def test_an_unusual_block_goes_through_the_email_package(name):
    block = UNUSUAL[name]
    # Given a block the fast parse does not take
    assert plain_headers(http.client._read_headers(io.BytesIO(block))) is None
    # Then the message is still the email package's (defects included)
    ours, theirs = both(block)
    assert ours == theirs


def test_a_folded_value_keeps_its_line_breaks_as_http_client_does():
    ours, _ = both(PLAIN["folded"])
    assert ours["items"][0] == ("X-Long", "first\r\n  second part\r\n\tthird")


class Socket:
    """What an http.client response reads from: `makefile` over the bytes a server sent."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))


RESPONSES = {
    "content length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Id: a\r\n\r\nhello",
    "100-continue first": b"HTTP/1.1 100 Continue\r\nX-Skipped: yes\r\n\r\n"
                          b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "connection close, no length": b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n"
                                   b"\r\nboom",
    "HTTP/1.0 keep-alive": b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\n"
                           b"Content-Length: 1\r\n\r\nx",
    "no content": b"HTTP/1.1 204 No Content\r\nX-Folded: a\r\n b\r\n\r\n",
    "unusual headers": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nnot a header\r\n\r\nabc",
}


def begun(response_class: type[http.client.HTTPResponse], data: bytes,
          method: str = "GET") -> dict[str, Any]:
    response = response_class(Socket(data), method=method)  # type: ignore[arg-type]
    response.begin()
    found = {name: getattr(response, name) for name in (
        "status", "reason", "version", "chunked", "length", "will_close")}
    found["message"] = attributes(response.msg)
    found["headers is msg"] = response.headers is response.msg
    found["body"] = response.read()
    return found


@pytest.mark.parametrize("name", RESPONSES)
def test_a_response_begins_as_http_clients_does(name):
    for method in ("GET", "HEAD"):
        assert begun(FastHTTPResponse, RESPONSES[name], method) == begun(
            http.client.HTTPResponse, RESPONSES[name], method)


def test_the_100_continue_headers_are_skipped_and_the_final_ones_kept():
    found = begun(FastHTTPResponse, RESPONSES["100-continue first"])
    assert (found["status"], found["message"]["items"], found["body"]) == (
        200, [("Content-Length", "2")], b"ok")


def sqs_client() -> Any:
    return botocore.session.get_session().create_client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")


def test_only_the_clients_given_use_it():
    # Given two clients, one given the fast headers
    fast, plain = sqs_client(), sqs_client()
    assert use_fast_headers(fast) is True
    # Then the fast one's pool manager makes connections answering with FastHTTPResponse
    manager = fast._endpoint.http_session._manager
    pool = manager.connection_from_url("https://sqs.us-east-1.amazonaws.com/")
    assert type(pool) is FastHTTPSConnectionPool
    assert pool.ConnectionCls.response_class is FastHTTPResponse
    # And the other client, and http.client itself, are untouched
    assert plain._endpoint.http_session._pool_classes_by_scheme == {
        "http": AWSHTTPConnectionPool, "https": AWSHTTPSConnectionPool}
    assert http.client.HTTPConnection.response_class is http.client.HTTPResponse
    assert http.client.parse_headers is not parse_headers


def test_an_unverified_standard_library_leaves_the_client_alone(monkeypatch, caplog):
    # Given a Python whose http.client/email code is not the verified code
    monkeypatch.setattr(headers, "VERIFIED_STDLIB", frozenset({"0" * 40}))
    monkeypatch.setattr(headers, "_verified", [])
    client = sqs_client()
    with caplog.at_level(logging.INFO, logger="messenger.fastboto"):
        assert use_fast_headers(client) is False
        assert use_fast_headers(sqs_client()) is False
    # Then the client keeps botocore's pools, and one line says why
    assert client._endpoint.http_session._pool_classes_by_scheme["https"] is (
        AWSHTTPSConnectionPool)
    assert [r.getMessage()[:32] for r in caplog.records] == ["fast response headers off: this "]


def test_this_python_is_the_verified_one():
    # The suite runs on the Python the image runs (3.11): a changed http.client or email
    # parser fails here; re-verify (run this file) and add the new fingerprint
    assert headers.stdlib_fingerprint() in headers.VERIFIED_STDLIB
