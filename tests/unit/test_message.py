"""The message envelope: encode/decode round trip and specific errors on bad input."""

import pytest

from messenger.errors import InvalidMessage, MessageDecodeError
from messenger.message import Message
from messenger.offload import OffloadPointer, lifecycle_days, pointer_attributes


def received_attributes(encoded):
    """Attributes as ReceiveMessage returns them (same keys as sent)."""
    return {name: dict(value) for name, value in encoded.attributes.items()}


def test_round_trip_keeps_body_routing_key_headers_id_and_time():
    message = Message({"sku": 1, "name": "ü"}, "MOBILE.APPLE", {"locale": "de_DE"})
    encoded = message.encode()
    decoded = Message.decode(encoded.body, received_attributes(encoded))
    assert decoded == message


def test_size_counts_body_and_attributes_in_bytes():
    encoded = Message("é", "rk", {}, message_id="id", produced_at=1.0).encode()
    assert encoded.size == len('"é"'.encode()) + sum(
        len(n) + len(v["DataType"]) + len(v["StringValue"].encode())
        for n, v in encoded.attributes.items()
    )


def test_a_body_size_the_encoder_measured_is_the_size_and_the_attributes_add_theirs():
    from messenger.message import EncodedMessage

    encoded = Message("é", "rk", {}, message_id="id", produced_at=1.0).encode()
    body_bytes = len(encoded.body.encode())
    known = EncodedMessage(encoded.body, encoded.attributes, body_size=body_bytes)
    assert known.size == encoded.size == body_bytes + encoded.attributes_size
    assert known == encoded  # the measured size is not part of the message


def test_text_checks_name_the_field_and_search_json_only_when_not_ascii():
    from messenger.produce.checks import check_json_text, utf8_text

    check_json_text("body", '{"a":"\\u0000 escaped by json.dumps"}')
    with pytest.raises(InvalidMessage, match=r"^body holds U\+FFFE \(a character SQS refuses\) "
                                             r"at position 6"):
        check_json_text("body", '{"a":"\ufffe"}')
    assert utf8_text("body", '"\uffff é"') == '"\uffff é"'.encode()
    with pytest.raises(InvalidMessage, match=r"^body holds U\+D800 \(a lone surrogate\) at "
                                             r"position 3"):
        utf8_text("body", '"ab\ud800"')


def test_a_body_that_is_not_json_serializable_is_a_clear_error():
    with pytest.raises(InvalidMessage, match="JSON-serializable"):
        Message({"when": object()}).encode()
    with pytest.raises(InvalidMessage, match="JSON-serializable"):
        Message(float("nan")).encode()


def test_bad_routing_key_and_headers_are_rejected():
    with pytest.raises(InvalidMessage, match="routing_key"):
        Message({}, routing_key="")
    with pytest.raises(InvalidMessage, match="meta_headers"):
        Message({}, meta_headers={"n": 1})


def test_decoding_garbage_raises_decode_error_not_a_crash():
    with pytest.raises(MessageDecodeError, match="not JSON"):
        Message.decode("{nope", {})
    with pytest.raises(MessageDecodeError, match="malformed"):
        Message.decode("1", {"meta_headers": {"DataType": "String", "StringValue": "[1]"}})


def test_foreign_messages_decode_with_the_sqs_message_id():
    decoded = Message.decode('{"a": 1}', None, fallback_id="sqs-id")
    assert (decoded.body, decoded.message_id, decoded.routing_key) == ({"a": 1}, "sqs-id", None)


def test_offload_pointer_is_the_aws_extended_client_format():
    pointer = OffloadPointer("bucket", "payloads/k")
    body = pointer.encode()
    assert body == (
        '["software.amazon.payloadoffloading.PayloadS3Pointer", '
        '{"s3BucketName": "bucket", "s3Key": "payloads/k"}]'
    )
    assert OffloadPointer.parse(body, pointer_attributes(10)) == pointer
    # The legacy attribute of older extended clients is read too.
    assert OffloadPointer.parse(body, {"SQSLargePayloadSize": {}}) == pointer
    # Without the size attribute a body that looks like a pointer is an ordinary body.
    assert OffloadPointer.parse(body, {}) is None


def test_lifecycle_outlives_retention_and_a_dead_letter_copy():
    # 14 days in the queue, up to 14 more in a FIFO DLQ (enqueue time reset), one day's margin
    assert lifecycle_days(14 * 86400) == 29
    assert lifecycle_days(3600) == 3


def test_a_body_nested_past_the_recursion_limit_is_undecodable_not_a_crash():
    # A permanent error: the consumer dead-letters it at once instead of retrying it 3 times
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(MessageDecodeError, match="nested deeper"):
        Message.decode(deep, {})
    deep_headers = {"meta_headers": {"DataType": "String", "StringValue": deep}}
    with pytest.raises(MessageDecodeError, match="malformed: RecursionError"):
        Message.decode("{}", deep_headers)


def test_the_fullest_envelope_fits_the_ten_attributes_sqs_takes():
    # Every attribute any feature can put on one message: the envelope, a job's max_attempts, an
    # exchange's priority, a typed body's schema version, an offload pointer and a consumer's
    # dead-letter reason and failure note. SQS refuses an 11th.
    from messenger.channel import PRIORITY_ATTRIBUTE, SQS_MAX_MESSAGE_ATTRIBUTES
    from messenger.message import (
        DEAD_LETTER_FAILURE_ATTRIBUTE,
        DEAD_LETTER_REASON_ATTRIBUTE,
        MAX_ATTEMPTS_ATTRIBUTE,
    )
    from messenger.schema import SCHEMA_VERSION_ATTRIBUTE

    envelope = Message({"n": 1}, "KEY", {"locale": "fr"}).encode().attributes
    names = {*envelope, MAX_ATTEMPTS_ATTRIBUTE, PRIORITY_ATTRIBUTE, SCHEMA_VERSION_ATTRIBUTE,
             *pointer_attributes(1), DEAD_LETTER_REASON_ATTRIBUTE, DEAD_LETTER_FAILURE_ATTRIBUTE}
    assert len(names) == 10 <= SQS_MAX_MESSAGE_ATTRIBUTES, sorted(names)
