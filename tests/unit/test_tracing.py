"""`messenger.tracing` without an endpoint: where the context goes in the envelope, the setting."""

from __future__ import annotations

import json

import pytest

from messenger.channel import PRIORITY_ATTRIBUTE, SQS_MAX_MESSAGE_ATTRIBUTES
from messenger.errors import InvalidSettings
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    MAX_ATTEMPTS_ATTRIBUTE,
    META_HEADERS_ATTRIBUTE,
    Message,
)
from messenger.offload import pointer_attributes
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE
from messenger.settings import Settings
from messenger.tracing import received_headers, with_headers

CONTEXT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
           "tracestate": "vendor=opaque"}


@pytest.mark.parametrize("headers", [{}, {"locale": "fr"}])
def test_the_context_shares_the_meta_headers_slot_of_the_fullest_envelope(headers):
    # Given every attribute a message can carry besides meta_headers (the fullest envelope)
    others = {MAX_ATTEMPTS_ATTRIBUTE, PRIORITY_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE,
              *pointer_attributes(1), DEAD_LETTER_REASON_ATTRIBUTE, DEAD_LETTER_FAILURE_ATTRIBUTE}
    encoded = Message({"n": 1}, "KEY", headers).encode()
    # When the trace context is added
    traced = with_headers(encoded, CONTEXT)
    # Then it takes the meta_headers slot (one of the 10) next to the user's headers
    names = {*traced.attributes, *others}
    assert len(names) == SQS_MAX_MESSAGE_ATTRIBUTES, sorted(names)
    assert json.loads(traced.attributes[META_HEADERS_ATTRIBUTE]["StringValue"]) == \
        {**headers, **CONTEXT}
    assert traced.body == encoded.body
    # And a consumer reads it back from the received attributes
    assert received_headers({"MessageAttributes": traced.attributes}) == {**headers, **CONTEXT}


def test_a_message_without_readable_headers_has_no_context():
    assert received_headers({}) == {}
    broken = {META_HEADERS_ATTRIBUTE: {"DataType": "String", "StringValue": "not json"}}
    assert received_headers({"MessageAttributes": broken}) == {}


def test_no_context_leaves_the_message_as_it_was():
    encoded = Message({"n": 1}).encode()
    assert with_headers(encoded, {}) is encoded


def test_an_unknown_tracing_mode_is_refused_naming_the_variable_and_its_values():
    with pytest.raises(InvalidSettings, match=r"^tracing \(MESSENGER_TRACING\) must be one of "
                                              r"auto, on, off, got 'yes'$"):
        Settings.from_env({"MESSENGER_TRACING": "yes"})
    assert Settings.from_env({}).tracing == "auto"
    assert Settings.from_env({"MESSENGER_TRACING": "off"}).as_env()["MESSENGER_TRACING"] == "off"
