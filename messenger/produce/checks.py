"""Per-item checks a producer runs before sending, and the ids of ordered messages.

Every problem with one item becomes an `InvalidMessage` naming the field, so `push` raises a clear
error and `push_many` reports the item in `result.failures` while the other items are sent. The
checks mirror what SQS and SNS refuse, which would otherwise fail a whole batch request:

- text that goes to SQS or SNS (routing key, header names and values, a body sent inline) may
  hold only the characters SQS accepts: #x9 #xA #xD, #x20-#xD7FF, #xE000-#xFFFD,
  #x10000-#x10FFFF (no lone surrogates, no U+FFFE/FFFF);
- a body offloaded to S3 goes there as UTF-8 bytes, and SQS carries only its pointer: it may
  hold any character except a lone surrogate (which has no UTF-8 form); U+FFFE/FFFF are fine;
- `group_id`, `dedup_id` and a caller's `message_id` are 1-128 characters of letters, digits and
  ASCII punctuation (SQS's rule for MessageGroupId and MessageDeduplicationId);
- `max_attempts` is a whole number from 1 to the channel's `max_receives`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from messenger.errors import InvalidMessage

#: Longest MessageGroupId / MessageDeduplicationId SQS accepts (and of a caller's message id).
MAX_ID_LENGTH = 128

_REFUSED_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")


def check_attempts(value: Any, max_receives: int, channel: str) -> None:
    """InvalidMessage unless `max_attempts` is a whole number from 1 to `max_receives`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_receives:
        raise InvalidMessage(
            f"max_attempts must be a whole number from 1 to {max_receives} (the max_receives of "
            f"channel {channel!r}), got {value!r}"
        )


def check_text(field: str, value: str) -> None:
    """InvalidMessage naming `field` when `value` holds a character SQS and SNS refuse."""
    found = _REFUSED_CHARACTER.search(value)
    if found is not None:
        code = ord(found.group())
        what = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a character SQS refuses"
        raise InvalidMessage(
            f"{field} holds U+{code:04X} ({what}) at position {found.start()}: text must be "
            f"valid Unicode without control characters other than tab, LF and CR"
        )


def check_json_text(field: str, value: str) -> None:
    """`check_text` for JSON that `json.dumps` wrote: it escapes every control character, so
    only a non-ASCII character can be refused, and an ASCII text (most bodies) is not searched."""
    if not value.isascii():
        check_text(field, value)


def utf8_text(field: str, value: str) -> bytes:
    """`value` in UTF-8; InvalidMessage naming `field` when it holds a lone surrogate (the only
    characters without a UTF-8 form)."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(value[error.start])
        raise InvalidMessage(
            f"{field} holds U+{code:04X} (a lone surrogate) at position {error.start}: text "
            f"must be valid Unicode"
        ) from None


def check_id(field: str, value: Any) -> None:
    """InvalidMessage naming `field` unless `value` is a valid FIFO id / message id."""
    if not isinstance(value, str) or _ID.match(value) is None:
        raise InvalidMessage(
            f"{field} must be 1 to {MAX_ID_LENGTH} letters, digits or ASCII punctuation "
            f"(no spaces), got {value!r}"
        )


def merged_headers(defaults: Any, given: Any) -> dict[str, str]:
    """The producer's `meta_headers()` overlaid with an item's own, both checked."""
    merged: dict[str, str] = {}
    for field, headers in (("meta_headers() of the producer", defaults), ("meta_headers", given)):
        if headers is None:
            continue
        if not isinstance(headers, Mapping):
            raise InvalidMessage(
                f"{field} must be a mapping of strings to strings, got "
                f"{type(headers).__name__}: {headers!r:.100}"
            )
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise InvalidMessage(
                    f"{field} must map strings to strings, got {name!r:.100}: {value!r:.100}"
                )
            check_text(f"{field} name {name!r:.100}", name)
            check_text(f"{field}[{name!r:.100}]", value)
            merged[name] = value
    return merged


def content_dedup_id(
    group_id: str,
    routing_key: str | None,
    headers: Mapping[str, str],
    body_utf8: bytes,
    level: str | None = None,
) -> str:
    """The deduplication id of an ordered message without one: SHA-256 of what it carries
    (group, routing key, headers, priority level and body, its JSON in UTF-8), so the same push
    twice is the same message."""
    key = json.dumps(
        [group_id, routing_key, dict(sorted(headers.items())), level], ensure_ascii=True
    )
    digest = hashlib.sha256(key.encode())
    digest.update(b"\0")
    digest.update(body_utf8)
    return digest.hexdigest()


def ordered_message_id(channel: str, dedup_id: str) -> str:
    """The message id of an ordered message: derived from its deduplication key (SQS dedups
    per queue, across groups), so a push that SQS drops as a duplicate returns (and is tracked
    under) the id of the message it repeats."""
    key = f"{channel}\0{dedup_id}".encode()
    return hashlib.sha256(key).hexdigest()[:32]
