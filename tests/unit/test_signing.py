"""FastSigV4Auth signs byte for byte as botocore's SigV4Auth, and factory clients use it."""

from __future__ import annotations

import datetime
import io
from typing import Any

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.credentials import Credentials

from messenger.aws import ClientFactory
from messenger.fastboto.signing import FastSigV4Auth, SignedHeaders

NOW = datetime.datetime(2026, 11, 23, 23, 59, 58)
TOMORROW = datetime.datetime(2026, 11, 24, 0, 0, 1)
KEYS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token")
OTHER_KEYS = Credentials("AKIDOTHER", "another-secret", None)

SQS_HEADERS = {
    "X-Amz-Target": "AmazonSQS.ReceiveMessage", "Content-Type": "application/x-amz-json-1.0",
    "x-amzn-query-mode": "true", "User-Agent": "Boto3/1.44.5 md/Botocore#1.44.5",
    "amz-sdk-invocation-id": "dd148cde-2ed3-4536-b1b5-4fa1641e65cf",
    "amz-sdk-request": "attempt=1; max=5",
}

# (name, method, url, headers, body, params, context)
REQUESTS: list[tuple[str, str, str, dict[str, str], Any, Any, dict[str, Any]]] = [
    ("sqs json", "POST", "https://sqs.us-east-1.amazonaws.com/", SQS_HEADERS,
     b'{"QueueUrl": "q", "MaxNumberOfMessages": 10}', None, {}),
    ("local port", "POST", "http://127.0.0.1:4566/", SQS_HEADERS, b"{}", None, {}),
    ("sns form", "POST", "https://sns.eu-west-1.amazonaws.com/",
     {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
     "Action=Publish&Message=caf%C3%A9&TopicArn=arn", None, {}),
    ("query params", "GET", "https://example.amazonaws.com/a%20b/c", {"X-Amz-Meta": "1"},
     b"", {"b": "2 3", "a": "1", "é": "~"}, {}),
    ("query in url", "GET", "https://example.amazonaws.com/path?z=1&a=2&a=1", {}, None, None, {}),
    ("explicit host, odd case and spaces", "POST", "https://sqs.us-east-1.amazonaws.com/",
     {"HOST": "sqs.us-east-1.amazonaws.com", "X-Custom-Header": "  a   b \t c  ",
      "x-amz-meta-Name": "café", "Expect": "100-continue", "X-Amzn-Trace-Id": "Root=1"},
     b"body", None, {}),
    ("form dict body", "POST", "https://sns.eu-west-1.amazonaws.com/", {},
     {"Action": "Publish", "Message": "café & more"}, None, {}),
    ("empty bytes", "POST", "https://example.amazonaws.com/", {}, b"", None, {}),
    ("empty text", "POST", "https://example.amazonaws.com/", {}, "", None, {}),
    ("text body", "POST", "https://example.amazonaws.com/", {}, "naïve ☃", None, {}),
    ("seekable body", "PUT", "https://example.amazonaws.com/o", {}, "stream", None, {}),
    ("unsigned payload", "POST", "https://example.amazonaws.com/", {}, b"data", None,
     {"payload_signing_enabled": False}),
    ("unsigned payload over http (signed)", "POST", "http://localhost:4566/", {}, b"data",
     None, {"payload_signing_enabled": False}),
    ("streaming checksum trailer", "PUT", "https://example.amazonaws.com/o", {}, b"data", None,
     {"checksum": {"request_algorithm": {"in": "trailer", "algorithm": "crc32"}}}),
    ("content sha given", "POST", "https://example.amazonaws.com/",
     {"X-Amz-Content-SHA256": "abc123"}, b"data", None, {}),
    ("a re-sign (retry)", "POST", "https://example.amazonaws.com/",
     {"Authorization": "old", "X-Amz-Date": "20200101T000000Z",
      "X-Amz-Security-Token": "old-token"}, b"data", None, {}),
]


def request_for(case: tuple[Any, ...]) -> AWSRequest:
    _, method, url, headers, body, params, context = case
    data = io.BytesIO(b"streamed body") if body == "stream" else body
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=data,
                         params=params)
    request.context.update(context)
    return request


def signed(cls: type[SigV4Auth], case: tuple[Any, ...], credentials: Credentials,
           region: str = "us-east-1", service: str = "sqs") -> dict[str, Any]:
    request = request_for(case)
    cls(credentials.get_frozen_credentials(), service, region).add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize("case", REQUESTS, ids=[case[0] for case in REQUESTS])
def test_every_header_is_the_one_botocore_signs(case, monkeypatch):
    for now in (NOW, TOMORROW):  # the kept signing key is the day's
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda now=now: now)
        for credentials in (KEYS, OTHER_KEYS, KEYS):  # and the secret's
            for region, service in (("us-east-1", "sqs"), ("eu-west-1", "sns")):
                ours = signed(FastSigV4Auth, case, credentials, region, service)
                theirs = signed(SigV4Auth, case, credentials, region, service)
                assert ours == theirs
                assert ours["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=")


@pytest.mark.parametrize("case", REQUESTS, ids=[case[0] for case in REQUESTS])
def test_the_payload_hash_is_botocores(case):
    credentials = KEYS.get_frozen_credentials()
    assert FastSigV4Auth(credentials, "sqs", "us-east-1").payload(request_for(case)) == \
        SigV4Auth(credentials, "sqs", "us-east-1").payload(request_for(case))


def test_signed_headers_read_like_botocores_http_headers():
    from botocore.compat import HTTPHeaders

    ours, theirs = SignedHeaders(), HTTPHeaders()
    for name, value in (("x-amz-date", "1"), ("x-dup", "a"), ("X-Dup", "b"), ("host", "h")):
        ours[name] = value
        theirs[name] = value
    assert sorted(set(ours)) == sorted({name.lower() for name in theirs})
    for name in ("x-dup", "X-DUP", "host", "missing"):
        assert ours.get_all(name) == theirs.get_all(name)
        assert (name in ours) == (name in theirs)


def answering(body: bytes, sent: list[Any] | None = None) -> Any:
    """A `before-send` hook: no request goes out, every one gets 200 with `body` (and is kept
    in `sent`)."""
    class Body:
        def stream(self, **_: Any) -> Any:
            yield body

    def answer(request: Any = None, **_: Any) -> AWSResponse:
        if sent is not None:
            sent.append(request)
        return AWSResponse(request.url, 200, {}, Body())

    return answer


@pytest.fixture
def keys_in_env(monkeypatch):
    """Credentials in the environment, and the fast paths on (whatever botocore is installed:
    these tests hold them against it)."""
    monkeypatch.setenv("MESSENGER_FAST_BOTOCORE", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", str(KEYS.token))


def test_a_factory_client_signs_with_it_and_sends_botocores_signature(keys_in_env, monkeypatch):
    # Given: a factory's SQS client, a fixed clock, and no network (before-send answers)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW)
    used: list[str] = []
    original = FastSigV4Auth.headers_to_sign

    def spy(self: Any, request: Any) -> Any:
        used.append(type(self).__name__)
        return original(self, request)

    monkeypatch.setattr(FastSigV4Auth, "headers_to_sign", spy)
    factory = ClientFactory("us-east-1", endpoint_url="https://sqs.us-east-1.amazonaws.com")
    sent: list[Any] = []
    for validate in (True, False):
        client = factory.client("sqs", validate_params=validate)
        client.meta.events.register(
            "before-send", answering(b'{"Successful": [], "Failed": []}', sent))
        # When: it makes a call
        client.delete_message_batch(QueueUrl="https://sqs.us-east-1.amazonaws.com/1/q",
                                    Entries=[{"Id": "0", "ReceiptHandle": "handle"}])
    # Then: FastSigV4Auth signed it, and botocore's signer signs the request sent the same way
    assert used and set(used) == {"FastSigV4Auth"}
    for request in sent:
        authorization = request.headers["Authorization"].decode()
        names = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
        headers = {name: value.decode() if isinstance(value, bytes) else value
                   for name, value in request.headers.items() if name.lower() in names}
        again = AWSRequest(method=request.method, url=request.url, headers=headers,
                           data=request.body)
        SigV4Auth(KEYS.get_frozen_credentials(), "sqs", "us-east-1").add_auth(again)
        assert authorization == again.headers["Authorization"]


def test_other_signers_stay_botocores(keys_in_env):
    chosen: list[type[Any]] = []
    factory = ClientFactory("us-east-1", endpoint_url="https://example.amazonaws.com")
    s3 = factory.client("s3")
    original = s3._request_signer.get_auth_instance

    def spy(*args: Any, **kwargs: Any) -> Any:
        auth = original(*args, **kwargs)
        chosen.append(type(auth))
        return auth

    s3._request_signer.get_auth_instance = spy
    s3.meta.events.register("before-send", answering(b""))
    s3.put_object(Bucket="bucket", Key="key", Body=b"x")
    assert chosen and all(cls is S3SigV4Auth for cls in chosen)
    # a presigned URL is signed in the query string by botocore's query signer
    sqs = factory.client("sqs")
    url = sqs.generate_presigned_url("list_queues", ExpiresIn=60)
    assert "X-Amz-Signature=" in url
