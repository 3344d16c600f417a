"""The message envelope: what a producer sends and a consumer's handler gets.

Wire format (identical on SQS and SNS with raw delivery): the message body is the JSON of the
user's body; everything else travels in message attributes, so filter policies can see the
routing key and the body stays readable by any client:

| attribute      | type   | content                                   |
|----------------|--------|-------------------------------------------|
| routing_key    | String | routing key (absent when none)            |
| meta_headers   | String | JSON object of string headers             |
| message_id     | String | id given by the producer (uuid4 hex)      |
| produced_at    | Number | epoch seconds when the producer encoded it |
| max_attempts   | Number | attempts the job may take (absent: the consumer's) |
| schema_version | String | the body model's version (typed messages) |
| dead_letter_reason | String | why a consumer sent it to the DLQ (DLQ only) |
| dead_letter_failure | String | JSON of what failed (DLQ only; `messenger.consume.failures`) |

A message carries at most all 10 of the attributes SQS allows (`SQS_MAX_MESSAGE_ATTRIBUTES`): the
six above, `priority` (prioritized exchanges, `messenger.channel`), the offload size
(`messenger.offload`) and, in a DLQ, the two dead-letter ones. A feature that adds one more must
share a slot (tests/unit/test_message.py counts them), as the W3C trace context does: it
travels in `meta_headers` (`messenger.tracing`).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from messenger.channel import ROUTING_KEY_ATTRIBUTE
from messenger.errors import InvalidMessage, JobFailed, MessageDecodeError

META_HEADERS_ATTRIBUTE = "meta_headers"
MESSAGE_ID_ATTRIBUTE = "message_id"
PRODUCED_AT_ATTRIBUTE = "produced_at"
#: Set by a consumer when it forwards a message to the DLQ itself (timeout, undecodable body, ...);
#: the requeuer removes it when it moves the message back.
DEAD_LETTER_REASON_ATTRIBUTE = "dead_letter_reason"
DEAD_LETTER_FAILURE_ATTRIBUTE = "dead_letter_failure"
#: The producer's `max_attempts` of a job (a whole number >= 1; absent: the consumer's).
MAX_ATTEMPTS_ATTRIBUTE = "max_attempts"
#: A routing key is at most this long (SNS filter values are compared as strings).
MAX_ROUTING_KEY_LENGTH = 256

#: Meta header of a job released after its dependencies (`push(depends_on=...)`, a group's
#: callback): the JSON of each dependency's result or failure (`Message.dependencies`).
DEPENDENCIES_HEADER = "messenger-dependencies"

AttributeMap = dict[str, dict[str, str]]


@dataclass(frozen=True)
class ResultOmitted:
    """A dependency's result too large to travel in the message: the job completed; read its
    result with `Producer.result(job_id)`."""

    job_id: str


def decode_dependencies(meta_headers: Mapping[str, str]) -> dict[str, Any]:
    """The dependencies a released job carries (DEPENDENCIES_HEADER): job id → its result, a
    `ResultOmitted`, or the `messenger.JobFailed` of a dependency that did not complete. {}
    for a job that waited on nothing (or a header that is not ours)."""
    text = meta_headers.get(DEPENDENCIES_HEADER)
    if not text:
        return {}
    try:
        values = json.loads(text)
    except ValueError:
        return {}
    found: dict[str, Any] = {}
    for job_id, value in values.items() if isinstance(values, dict) else ():
        if not isinstance(value, dict):
            continue
        if "result" in value:
            found[job_id] = value["result"]
        elif value.get("omitted"):
            found[job_id] = ResultOmitted(job_id)
        else:
            found[job_id] = JobFailed(job_id, str(value.get("outcome", "")),
                                      reason=str(value.get("reason", "")),
                                      error_type=str(value.get("error_type", "")),
                                      error=str(value.get("error", "")))
    return found


def _new_id() -> str:
    return uuid.uuid4().hex


def _check_envelope(routing_key: Any, meta_headers: Any) -> None:
    """InvalidMessage unless the routing key and meta headers are valid (see `Message`)."""
    if routing_key is not None and (
        not isinstance(routing_key, str) or not 1 <= len(routing_key) <= MAX_ROUTING_KEY_LENGTH
    ):
        raise InvalidMessage(
            f"routing_key must be a string of 1 to {MAX_ROUTING_KEY_LENGTH} characters "
            f"or None, got {routing_key!r}"
        )
    if not (type(meta_headers) is dict or isinstance(meta_headers, Mapping)) or meta_headers and \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in meta_headers.items()):
        raise InvalidMessage(f"meta_headers must map strings to strings, got {meta_headers!r}")


def sendable_attributes(received: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Received MessageAttributes in SendMessage's shape (drops the empty list fields), to
    forward a message unchanged (to a DLQ, or back from one)."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in received.items():
        entry: dict[str, Any] = {"DataType": value["DataType"]}
        if "StringValue" in value:
            entry["StringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            entry["BinaryValue"] = value["BinaryValue"]
        out[name] = entry
    return out


@dataclass(frozen=True)
class EncodedMessage:
    """A message ready for SendMessage/Publish: body text and message attributes."""

    body: str
    attributes: AttributeMap
    #: The body's size in UTF-8 bytes when the encoder has measured it already (None: measured
    #: here), so a large body is not encoded again to size it.
    body_size: int | None = field(default=None, compare=False, repr=False)

    @cached_property
    def size(self) -> int:
        """Size as SQS and SNS count it: body plus attribute names, types and values, in bytes."""
        body = len(self.body.encode("utf-8")) if self.body_size is None else self.body_size
        return body + self.attributes_size

    @property
    def attributes_size(self) -> int:
        """The attributes' share of `size`: names, types and values, in bytes."""
        total = 0
        for name, value in self.attributes.items():
            total += len(name.encode()) + len(value["DataType"].encode())
            total += len(value.get("StringValue", "").encode("utf-8"))
        return total


@dataclass(frozen=True)
class Message:
    """One message. body: any JSON-serializable value. routing_key: optional string (1-256 chars).

    meta_headers: string-to-string headers (e.g. locale). message_id and produced_at are set
    by the producer when not given.
    """

    body: Any
    routing_key: str | None = None
    meta_headers: Mapping[str, str] = field(default_factory=dict)
    message_id: str = field(default_factory=_new_id)
    produced_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        _check_envelope(self.routing_key, self.meta_headers)

    @property
    def dependencies(self) -> dict[str, Any]:
        """Job id → result, `ResultOmitted` or `messenger.JobFailed`, of each job this one
        waited on (`decode_dependencies`); {} for a job that waited on nothing."""
        return decode_dependencies(self.meta_headers)

    def encode(self) -> EncodedMessage:
        """Body JSON plus attributes; InvalidMessage when the body is not JSON-serializable."""
        try:
            body = json.dumps(self.body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise InvalidMessage(
                f"body must be JSON-serializable (dict, list, str, int, float, bool, None): {error}"
            ) from None
        attributes: AttributeMap = {
            MESSAGE_ID_ATTRIBUTE: {"DataType": "String", "StringValue": self.message_id},
            PRODUCED_AT_ATTRIBUTE: {
                "DataType": "Number",
                "StringValue": repr(float(self.produced_at)),
            },
        }
        if self.meta_headers:
            attributes[META_HEADERS_ATTRIBUTE] = {
                "DataType": "String",
                "StringValue": json.dumps(dict(self.meta_headers), sort_keys=True),
            }
        if self.routing_key is not None:
            attributes[ROUTING_KEY_ATTRIBUTE] = {
                "DataType": "String",
                "StringValue": self.routing_key,
            }
        return EncodedMessage(body=body, attributes=attributes)

    @classmethod
    def decode(
        cls, body: str, attributes: Mapping[str, Mapping[str, Any]] | None, fallback_id: str = ""
    ) -> Message:
        """Rebuild a message from a received body and attributes (SQS ReceiveMessage format).

        Messages from other producers (no messenger attributes) decode with `fallback_id`
        (the SQS MessageId) and no headers. Raises MessageDecodeError on a non-JSON body or
        malformed attributes.
        """
        value, routing_key, meta, message_id, produced_at = decode_envelope(
            body, attributes, fallback_id)
        return cls(body=value, routing_key=routing_key, meta_headers=meta,
                   message_id=message_id, produced_at=produced_at)


def decode_envelope(
    body: str, attributes: Mapping[str, Mapping[str, Any]] | None, fallback_id: str = ""
) -> tuple[Any, str | None, dict[str, str], str, float]:
    """`Message.decode`'s checked parts: (body value, routing key, meta headers (a dict of its own),
    message id, produced_at), without building a Message (a consumer builds its handler's
    message from them). Raises MessageDecodeError like `Message.decode`."""
    try:
        value = json.loads(body)
    except (TypeError, ValueError) as error:
        raise MessageDecodeError(f"message body is not JSON: {error}") from None
    except RecursionError:  # nesting deeper than the interpreter's limit: never decodable
        raise MessageDecodeError(
            "message body is nested deeper than this consumer can decode "
            f"(Python's recursion limit, {sys.getrecursionlimit()})"
        ) from None
    attrs = attributes or {}
    try:
        meta_raw, produced_raw, routing_key, message_id = (
            None if entry is None else str(entry.get("StringValue", ""))
            for entry in (attrs.get(META_HEADERS_ATTRIBUTE), attrs.get(PRODUCED_AT_ATTRIBUTE),
                          attrs.get(ROUTING_KEY_ATTRIBUTE), attrs.get(MESSAGE_ID_ATTRIBUTE))
        )
        meta = json.loads(meta_raw) if meta_raw else {}
        produced_at = float(produced_raw) if produced_raw else 0.0
        _check_envelope(routing_key, meta)
        return value, routing_key, meta, message_id or fallback_id or _new_id(), produced_at
    except (ValueError, TypeError, InvalidMessage, RecursionError) as error:
        raise MessageDecodeError(
            f"message attributes are malformed: {type(error).__name__}: {error}"
        ) from None
