"""What a handler's failure leaves behind, and when its message is tried again.

- `HandlerFailure`: the error type, message and the last MAX_TRACEBACK_BYTES of the traceback
  of one failed run (never the message body), for the `failed` event, the status store and the
  dead letter.
- `RetryPolicy`: how many attempts a message gets (the producer's `max_attempts`, else the
  consumer's, never more than the channel's `max_receives`) and how long it waits between them
  (exponential backoff with jitter, capped).
- `failure_note`: the DEAD_LETTER_FAILURE_ATTRIBUTE value of a message the consumer dead-letters.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from messenger.message import MAX_ATTEMPTS_ATTRIBUTE

#: The end of a traceback that is kept (the innermost frames and the error line).
MAX_TRACEBACK_BYTES = 4096
#: Longest error message kept.
MAX_ERROR_MESSAGE_LENGTH = 1024
#: SQS's longest visibility timeout, and how long a message may stay in flight in all.
MAX_RETRY_DELAY_SECONDS = 43_200


def _tail(text: str, limit: int) -> str:
    """The last `limit` bytes of `text` (UTF-8, cut at a character), marked when cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return "...\n" + data[-limit:].decode("utf-8", errors="ignore")


@dataclass(frozen=True)
class HandlerFailure:
    """One failed run: error type, message and the end of its traceback."""

    error_type: str
    error_message: str
    traceback: str

    @classmethod
    def of(cls, error: BaseException) -> HandlerFailure:
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        return cls(
            error_type=type(error).__name__,
            error_message=str(error)[:MAX_ERROR_MESSAGE_LENGTH],
            traceback=_tail("".join(lines), MAX_TRACEBACK_BYTES),
        )

    def fields(self) -> dict[str, str]:
        """The `failed` event's fields: `error` ('Type: message'), `error_class`, `traceback`."""
        return {"error": f"{self.error_type}: {self.error_message}",
                "error_class": self.error_type, "traceback": self.traceback}


def exhausted_reason(attempt: int, attempts: int) -> str:
    """The dead-letter reason of a job whose last attempt failed."""
    return f"failed: attempts used up ({attempt} of {attempts})"


def failure_note(
    attempts: int, consumer: str, failure: HandlerFailure | None = None,
    at: datetime.datetime | None = None,
) -> str:
    """The JSON of DEAD_LETTER_FAILURE_ATTRIBUTE: attempts, at (ISO-8601 UTC), consumer, and for
    a handler's failure error_type, error_message and traceback. ASCII only (any character is
    escaped), so SQS takes it whatever the error says."""
    when = at or datetime.datetime.now(datetime.timezone.utc)
    note: dict[str, Any] = {}
    if failure is not None:
        note.update(error_type=failure.error_type, error_message=failure.error_message,
                    traceback=failure.traceback)
    note.update(attempts=attempts, at=when.isoformat(timespec="milliseconds"),
                consumer=consumer)
    return json.dumps(note, separators=(",", ":"))


def requested_attempts(attributes: Mapping[str, Mapping[str, Any]]) -> int | None:
    """The producer's `max_attempts` of a received message (None: none, or unreadable)."""
    entry = attributes.get(MAX_ATTEMPTS_ATTRIBUTE)
    if entry is None:
        return None
    try:
        value = int(str(entry.get("StringValue", "")))
    except ValueError:
        return None
    return value if value >= 1 else None


@dataclass(frozen=True)
class RetryPolicy:
    """A consumer's attempts and delays (see `Consumer`).

    max_receives: the channel's; max_attempts: the consumer's default (None: max_receives).
    retry_delay: seconds before the second attempt; retry_backoff: factor per attempt (1: the
    same delay each time); max_retry_delay: the longest delay. Each delay is drawn between half
    and all of its exponential value (jitter: failures at the same moment spread out).
    """

    max_receives: int
    max_attempts: int | None
    retry_delay: float
    retry_backoff: float
    max_retry_delay: float

    def attempts(self, attributes: Mapping[str, Mapping[str, Any]]) -> int:
        """How many attempts a message gets: its producer's `max_attempts`, else the
        consumer's, at most `max_receives` (SQS's redrive would move it then anyway)."""
        wanted = requested_attempts(attributes) or self.max_attempts or self.max_receives
        return min(wanted, self.max_receives)

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> int:
        """Whole seconds a message waits after failing its `attempt`-th run (1-based)."""
        exponent = min(max(attempt - 1, 0), 64)  # beyond, every delay is the cap anyway
        full = min(self.max_retry_delay, self.retry_delay * self.retry_backoff ** exponent)
        return min(math.ceil(full / 2 + draw() * full / 2), int(self.max_retry_delay))
