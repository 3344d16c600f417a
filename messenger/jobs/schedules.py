"""Scheduled jobs: when a push becomes a job, and what an EventBridge Scheduler schedule sends.

A push with `at=` or `delay=` is planned here (`plan_delivery`):

| channel              | due within SQS's 15 minutes             | due later         |
|----------------------|-----------------------------------------|-------------------|
| standard queue       | `DelaySeconds`                          | one-time schedule |
| ordered (FIFO) queue | one-time schedule (no per-message delay) | one-time schedule |
| exchange (SNS topic) | one-time schedule (SNS has no delay)     | one-time schedule |

A schedule's target is Scheduler's universal target (`aws-sdk:sqs:sendMessage`, or
`aws-sdk:sns:publish` for an exchange): its input is the SendMessage (Publish) request itself,
so the message keeps every attribute it was encoded with (the templated SQS target sets only
MessageGroupId). The job id is the message id encoded at push time: Scheduler's at-least-once
retries resend the same id (and, on an ordered channel, the same deduplication id).

Recurring schedules (`RecurringSchedule`) are declared in code and deployed by the CDK app; each
firing's job id is '<name>@<scheduled time>' (`<aws.scheduler.scheduled-time>`), so a retried
firing is the same job. They, the expressions (cron, rate, time zones) and the target's request
live in the core module `messenger.schedule_spec` (the CDK app imports it; re-exported here).
This module is pure too (no AWS calls).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from messenger.channel import SQS_MAX_DELAY_SECONDS
from messenger.errors import InvalidMessage

# What a schedule is (no AWS; the CDK app imports it from the core): re-exported here.
from messenger.schedule_spec import (  # noqa: F401
    MAX_EVENT_AGE_SECONDS,
    MAX_SCHEDULE_NAME,
    PUBLISH_TARGET,
    RETRY_ATTEMPTS,
    SCHEDULED_HEADER,
    SCHEDULED_TIME,
    SEND_MESSAGE_TARGET,
    RecurringSchedule,
    at_expression,
    check_timezone,
    cron_expression,
    parse_at,
    rate_expression,
    retry_policy,
    target_arn,
    target_input,
)

#: How far ahead a job may be due: `at` at most this long after the push, `delay` at most this
#: long (366 days, in seconds). One bound for `push(at=/delay=)` and the HTTP API (`at`,
#: `delay_seconds`); beyond it, InvalidMessage names the field and this range.
MAX_AHEAD_SECONDS = 366 * 86_400
MAX_AHEAD = timedelta(seconds=MAX_AHEAD_SECONDS)

#: The job part of a schedule name keeps a message id of these characters up to this length; a
#: longer or other id is named by its hash, 'h.' + 37 hex digits: a kept id has no '.', so the
#: two never meet (before, 'h' + 38 hex digits: an id of that form was taken for another's hash).
_JOB_KEY = re.compile(r"^[0-9A-Za-z_-]{1,39}$")
_HASHED_PREFIX = "h."
_CHANNEL_KEY_LENGTH = 24


# -- one-time jobs: routing ---------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """When a pushed message becomes a job. `delay_seconds` set: SQS's own DelaySeconds carries
    it; None: a one-time schedule due at `due` (UTC, whole seconds)."""

    due: datetime
    delay_seconds: int | None = None

    @property
    def scheduled(self) -> bool:
        return self.delay_seconds is None

    @property
    def expression(self) -> str:
        """The schedule's `at(...)` expression (its time zone is UTC)."""
        return at_expression(self.due)


def plan_delivery(at: datetime | None, delay: timedelta | float | None, *, ordered: bool,
                  fanout: bool, now: datetime | None = None) -> Delivery | None:
    """How a push with `at=` / `delay=` is delivered: None (now), DelaySeconds or a schedule.

    at: a timezone-aware datetime, not in the past. delay: a timedelta or seconds, >= 0.
    ordered: the channel is FIFO (no per-message delay). fanout: the channel is an exchange
    (an SNS topic: no delay at all). now: the current time (tests). InvalidMessage, naming the
    value, for both given, a naive or past `at`, a negative or non-numeric delay, and for a time
    beyond `MAX_AHEAD_SECONDS` (366 days; also `datetime.max` and `timedelta.max`). A wait of up
    to 900 s inclusive on a standard queue is SQS's DelaySeconds."""
    if at is None and delay is None:
        return None
    now = now or datetime.now(timezone.utc)
    if at is not None and delay is not None:
        raise InvalidMessage("give at= or delay=, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidMessage(f"at must be a datetime, got {type(at).__name__}: {at!r}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidMessage(
                f"at={at.isoformat()} has no time zone: give an aware datetime, e.g. "
                f"datetime(..., tzinfo=timezone.utc) or ZoneInfo('Europe/Berlin')"
            )
        if at < now:
            raise InvalidMessage(
                f"at={at.isoformat()} is in the past (now: {now.isoformat(timespec='seconds')})"
            )
        seconds = (at - now).total_seconds()  # aware datetimes: no overflow, even at .max
        if seconds > MAX_AHEAD_SECONDS:
            raise InvalidMessage(
                f"at={at.isoformat()} is too far ahead: at must be from now to 366 days from "
                f"now (by {(now + MAX_AHEAD).isoformat(timespec='seconds')})"
            )
    else:
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int) and not isinstance(delay, bool):
            # clamped as an int first: float() of a huge one raises OverflowError
            seconds = float(min(max(delay, -1), MAX_AHEAD_SECONDS + 1))
        elif isinstance(delay, float) and math.isfinite(delay):
            seconds = delay
        else:
            raise InvalidMessage(f"delay must be a timedelta or seconds, got {delay!r}")
        if seconds < 0:
            raise InvalidMessage(f"delay must not be negative, got {delay!r}")
        if seconds > MAX_AHEAD_SECONDS:
            raise InvalidMessage(
                f"delay={delay!r} is too long: delay must be 0 to {MAX_AHEAD_SECONDS} seconds "
                f"(366 days)"
            )
    if seconds <= 0:
        return None
    # Rounded up: a job never runs before the time it was given (an at(...) expression holds
    # whole seconds: the second after a fraction, never the one before it). The due time is
    # the given moment rounded up, not `now` plus a rounded-up delay (which would add a second
    # to a whole-second `at`).
    due = (now + timedelta(seconds=seconds)).astimezone(timezone.utc)
    if due.microsecond:
        due = due.replace(microsecond=0) + timedelta(seconds=1)
    # DelaySeconds counts from when SQS takes the message (after `now`): the wait asked for,
    # rounded up, never early. Not the rounded-up due time's distance, which a fractional `now`
    # would push past 900 (SQS's limit, inclusive) for a delay of exactly 900.
    whole = math.ceil(seconds)
    if not ordered and not fanout and whole <= SQS_MAX_DELAY_SECONDS:
        return Delivery(due, delay_seconds=whole)
    return Delivery(due)


# -- names --------------------------------------------------------------------------------------
def _short_hash(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def channel_key(channel: str) -> str:
    """The channel part of its schedules' names (at most 24 characters; a longer name is cut
    and followed by its hash, so two channels never share one)."""
    if len(channel) <= _CHANNEL_KEY_LENGTH:
        return channel
    return f"{channel[:_CHANNEL_KEY_LENGTH - 9]}-{_short_hash(channel, 8)}"


def job_key(job_id: str) -> str:
    """The job part of a schedule name: the job id itself when it fits, else 'h.' + its hash
    (a kept id never has a '.': no id is named like another's hash)."""
    if _JOB_KEY.match(job_id):
        return job_id
    return f"{_HASHED_PREFIX}{_short_hash(job_id, 37)}"


def legacy_job_key(job_id: str) -> str | None:
    """The job part an id that is named by its hash had before 'h.' (None: the id is kept as
    it is, its name never changed): a job scheduled then is found under it."""
    if _JOB_KEY.match(job_id):
        return None
    return f"h{_short_hash(job_id, 38)}"


def schedule_name(channel: str, job_id: str) -> str:
    """The one-time schedule of a job: '<channel key>.<job key>' (at most 64 characters; the
    channel has no '.', so the name splits back at the first one)."""
    return f"{channel_key(channel)}.{job_key(job_id)}"


def channel_prefix(channel: str) -> str:
    """What the names of a channel's one-time schedules start with (ListSchedules NamePrefix)."""
    return f"{channel_key(channel)}."
