"""What a client sends: one job (`JobRequest`) or a batch (`BatchRequest`), and their limits.

Validation is pydantic's, run by Powertools' event handler before a route runs; `describe_errors`
turns its errors into one line per field ('max_attempts: Input should be a valid integer').
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from messenger.channel import MAX_BATCH_ENTRIES, SQS_MAX_RECEIVE_COUNT
from messenger.errors import InvalidMessage
from messenger.jobs.schedules import MAX_AHEAD, MAX_AHEAD_SECONDS
from messenger.jobs.workflows import MAX_DEPENDENCIES
from messenger.produce.checks import check_id

#: Jobs in one batch request (SQS's batch size: one SendMessageBatch per level).
MAX_BATCH_JOBS = MAX_BATCH_ENTRIES
#: Largest request body the API accepts: Lambda takes at most 6 MB (6,291,456 bytes) per
#: synchronous invocation, event envelope and headers included; 5.5 MiB leaves room for them.
#: (API Gateway's own limit, 10 MB, is higher: Lambda's is the one that binds.)
MAX_REQUEST_BYTES = 5 * 1024 * 1024 + 512 * 1024
#: Longest Idempotency-Key (the IETF draft sets none; DynamoDB keys are hashed anyway).
MAX_IDEMPOTENCY_KEY_LENGTH = 255
#: Longest `delay_seconds` of a job, and how far ahead its `at` may be: the library's one range
#: for `push(at=/delay=)` (`messenger.jobs.schedules.MAX_AHEAD_SECONDS`, 366 days). Up to 900 s
#: SQS's DelaySeconds on a standard queue, beyond (or on an ordered channel or an exchange) a
#: one-time EventBridge Scheduler schedule.
MAX_DELAY_SECONDS = MAX_AHEAD_SECONDS
#: RFC 3339 date-time with its zone ('Z' or an offset), as `at` takes it.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
AT_FORM = "an RFC 3339 time with its zone, e.g. 2026-12-01T09:00:00Z or 2026-12-01T10:00:00+01:00"


def _job_id(value: str) -> str:
    """A job id a job may depend on: what `push(message_id=)` takes."""
    try:
        check_id("a job id", value)
    except InvalidMessage as error:
        raise ValueError(str(error)) from None
    return value


class JobRequest(BaseModel):
    """One job. body: any JSON value (the message body). priority: one of the channel's levels.
    routing_key: an exchange's routing key (its subscriptions filter on it). group_id: ordered
    channel: the FIFO group; standard channel: the fair-queue tenant key. max_attempts: runs
    before the consumer dead-letters the job (1 to the channel's max_receives). delay_seconds:
    run the job this many seconds from now (0 to `MAX_DELAY_SECONDS`; default 0). at: run it at
    this RFC 3339 time with its zone (not with delay_seconds). Both are `push(delay=/at=)`'s:
    SQS's DelaySeconds within 15 minutes on a standard queue, else a one-time schedule.
    depends_on: job ids (1 to `MAX_DEPENDENCIES`, each a valid job id, on channels that keep
    results) the job waits for: it is held until each reached a final outcome.
    on_dependency_failure: with depends_on, "cancel" (the default: a failed dependency cancels
    the job) or "run" (it runs anyway, `message.dependencies` telling what failed)."""

    model_config = ConfigDict(extra="forbid")

    body: Any
    priority: str | None = Field(default=None, min_length=1)
    routing_key: str | None = Field(default=None, min_length=1, max_length=256)
    group_id: str | None = Field(default=None, min_length=1, max_length=128)
    max_attempts: int | None = Field(default=None, ge=1, le=SQS_MAX_RECEIVE_COUNT, strict=True)
    delay_seconds: int = Field(default=0, ge=0, le=MAX_DELAY_SECONDS, strict=True)
    at: datetime | None = None
    depends_on: list[Annotated[str, AfterValidator(_job_id)]] | None = Field(
        default=None, min_length=1, max_length=MAX_DEPENDENCIES)
    on_dependency_failure: Literal["cancel", "run"] | None = None

    @field_validator("on_dependency_failure", mode="after")
    @classmethod
    def _with_dependencies(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not info.data.get("depends_on"):
            raise ValueError("only with depends_on (the job ids the job waits for)")
        return value

    @field_validator("at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> datetime | None:
        """Only an RFC 3339 string with a zone (pydantic alone would take epoch numbers and
        zone-less times)."""
        if value is None:
            return None
        if not isinstance(value, str) or not _RFC3339.match(value):
            raise ValueError(f"{AT_FORM}; got {value!r:.80}")
        text = value[:-1] + "+00:00" if value[-1] in "Zz" else value
        try:
            at = datetime.fromisoformat(text.replace("t", "T"))
        except ValueError:
            raise ValueError(f"{AT_FORM}; got {value!r:.80} (no such date or time)") from None
        now = datetime.now(timezone.utc)
        if at - now > MAX_AHEAD:  # aware arithmetic: no overflow also for 9999-12-31T23:59-23:59
            raise ValueError(f"from now to {MAX_AHEAD_SECONDS // 86_400} days ahead (by "
                             f"{(now + MAX_AHEAD).strftime('%Y-%m-%dT%H:%M:%SZ')}), the range "
                             f"of delay_seconds too; got {value!r:.80}")
        return at


class BatchRequest(BaseModel):
    """Up to `MAX_BATCH_JOBS` jobs; each is validated on its own (one bad job never fails the
    others), so they arrive here as plain objects."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[Any] = Field(min_length=1, max_length=MAX_BATCH_JOBS)


def describe_errors(errors: Any) -> str:
    """pydantic's (or Powertools') validation errors as '<field>: <message>; ...'."""
    lines = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ())]
        if location[:1] == ["body"]:  # Powertools prefixes the request body
            location = location[1:]
        field = ".".join(location) or "request body"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "json_invalid":
            field, message = "request body", "not valid JSON"
        elif error.get("type") == "extra_forbidden":
            message = (f"unknown field; a job has {', '.join(JobRequest.model_fields)}"
                       if len(location) <= 1 or location[0] != "jobs" else message)
        lines.append(f"{field}: {message}")
    return "; ".join(lines)
