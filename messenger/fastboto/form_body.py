"""A query-protocol request body (SNS) url-encoded once per attempt instead of twice.

botocore keeps a query-protocol request's parameters as a dict until it sends them and encodes
them each time the body is read (`AWSRequestPreparer._prepare_body`): for the payload hash when
signing, then again to send. That is a fifth of a 10-entry PublishBatch's client CPU.
`encode_form_once`, a `before-sign` hook, writes botocore's own encoding into the request once;
other bodies (JSON, XML, streams) are left alone.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode


def encode_form_once(request: Any = None, **_: Any) -> None:
    """botocore `before-sign` hook: a dict body becomes the url-encoded bytes
    `AWSRequestPreparer._prepare_body` would make of it (UTF-8 keys and values, `doseq`)."""
    data = request.data
    if isinstance(data, dict):
        request.data = urlencode([(_utf8(k), _utf8(v)) for k, v in data.items()], doseq=True)


def _utf8(value: Any) -> Any:
    return value.encode("utf-8") if isinstance(value, str) else value
