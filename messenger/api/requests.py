"""What a client sends: one job (`JobRequest`) or a batch (`BatchRequest`), and their limits.

Validation is pydantic's, run by Powertools' event handler before a route runs; `describe_errors`
turns its errors into one line per field ('max_attempts: Input should be a valid integer').
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from messenger.channel import MAX_BATCH_ENTRIES, SQS_MAX_DELAY_SECONDS, SQS_MAX_RECEIVE_COUNT

#: Jobs in one batch request (SQS's batch size: one SendMessageBatch per level).
MAX_BATCH_JOBS = MAX_BATCH_ENTRIES
#: Largest request body the API accepts: Lambda takes at most 6 MB (6,291,456 bytes) per
#: synchronous invocation, event envelope and headers included; 5.5 MiB leaves room for them.
#: (API Gateway's own limit, 10 MB, is higher: Lambda's is the one that binds.)
MAX_REQUEST_BYTES = 5 * 1024 * 1024 + 512 * 1024
#: Longest Idempotency-Key (the IETF draft sets none; DynamoDB keys are hashed anyway).
MAX_IDEMPOTENCY_KEY_LENGTH = 255


class JobRequest(BaseModel):
    """One job. body: any JSON value (the message body). priority: one of the channel's levels.
    routing_key: an exchange's routing key (its subscriptions filter on it). group_id: ordered
    channel: the FIFO group; standard channel: the fair-queue tenant key. max_attempts: runs
    before the consumer dead-letters the job (1 to the channel's max_receives). delay_seconds:
    not available yet (only 0): a per-job delay needs the producer's support (issue 41)."""

    model_config = ConfigDict(extra="forbid")

    body: Any
    priority: str | None = Field(default=None, min_length=1)
    routing_key: str | None = Field(default=None, min_length=1, max_length=256)
    group_id: str | None = Field(default=None, min_length=1, max_length=128)
    max_attempts: int | None = Field(default=None, ge=1, le=SQS_MAX_RECEIVE_COUNT, strict=True)
    delay_seconds: int = Field(default=0, ge=0, le=SQS_MAX_DELAY_SECONDS, strict=True)


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
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "json_invalid":
            field, message = "request body", "not valid JSON"
        elif error.get("type") == "extra_forbidden":
            message = (f"unknown field; a job has {', '.join(JobRequest.model_fields)}"
                       if len(location) <= 1 or location[0] != "jobs" else message)
        lines.append(f"{field}: {message}")
    return "; ".join(lines)
