"""What a schedule is, with no AWS in it: cron, rate and time-zone validation, recurring jobs
(`RecurringSchedule`) and the request a schedule's universal target sends.

The small core the CDK app may import (stacks import `messenger.channel` and this module only):
`ChannelStack.add_schedule` validates with it at synthesis and builds each
`AWS::Scheduler::Schedule`'s target input from it, exactly as the runtime
(`messenger.jobs.schedules`, which re-exports these names) builds one-time schedules.
"""

from __future__ import annotations

import json
import math
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from messenger.channel import ROUTING_KEY_ATTRIBUTE
from messenger.errors import InvalidSettings
from messenger.message import MESSAGE_ID_ATTRIBUTE, META_HEADERS_ATTRIBUTE

#: Scheduler's universal targets: the input is the API request (any of its parameters).
SEND_MESSAGE_TARGET = "arn:aws:scheduler:::aws-sdk:sqs:sendMessage"
PUBLISH_TARGET = "arn:aws:scheduler:::aws-sdk:sns:publish"
#: Scheduler replaces this in a target's input with the firing's scheduled time (ISO 8601, UTC).
SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
#: The meta header a schedule's message carries (its due or scheduled time, ISO 8601 UTC): the
#: consumer claims such a job once, so a retried firing is one job (`messenger.jobs.fired`).
#: A header, not an attribute: every one of SQS's 10 attribute slots may be taken.
SCHEDULED_HEADER = "messenger-scheduled"
#: A schedule name: 1-64 letters, digits, '-', '_' and '.'.
MAX_SCHEDULE_NAME = 64
_SCHEDULE_NAME = re.compile(r"^[0-9A-Za-z_.-]{1,64}$")
#: Retry policy of every schedule: Scheduler retries a failed send with backoff this many times
#: (0-185) within this many seconds (60-86,400), then puts the event in the schedule DLQ.
RETRY_ATTEMPTS = 20
MAX_EVENT_AGE_SECONDS = 86_400
_AT = re.compile(r"^at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)$")
_RATE_UNITS = {"minute": 60, "hour": 3600, "day": 86_400}


# -- expressions --------------------------------------------------------------------------------
def at_expression(due: datetime) -> str:
    """`at(yyyy-mm-ddThh:mm:ss)` of an aware datetime, in UTC."""
    return f"at({due.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%S})"


def parse_at(expression: str, zone: str = "UTC") -> datetime | None:
    """The due time of an `at(...)` expression in time zone `zone`, None for cron and rate."""
    match = _AT.match(expression)
    if match is None:
        return None
    naive = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
    return naive.replace(tzinfo=check_timezone(zone)).astimezone(timezone.utc)


def check_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone `name` (e.g. 'Europe/Berlin'); InvalidSettings when unknown."""
    if not isinstance(name, str) or not name:
        raise InvalidSettings(f"timezone must be an IANA zone name like 'Europe/Berlin', "
                              f"got {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidSettings(f"unknown time zone {name!r}: give an IANA zone name like "
                              f"'Europe/Berlin' or 'UTC'") from None


def rate_expression(seconds: float) -> str:
    """`rate(n minutes|hours|days)` of an interval of whole minutes (at least 1)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or seconds < 60 or seconds % 60:
        raise InvalidSettings(
            f"rate must be a whole number of minutes, at least 1 (Scheduler's precision is a "
            f"minute), got {seconds!r} seconds"
        )
    for unit, size in reversed(_RATE_UNITS.items()):
        if seconds % size == 0:
            count = int(seconds // size)
            return f"rate({count} {unit}{'s' if count > 1 else ''})"
    raise AssertionError("unreachable: minutes divide every whole-minute interval")


@dataclass(frozen=True)
class _CronField:
    name: str
    low: int
    high: int
    specials: str  # which of '?', 'L', 'W', '#' the field takes
    names: tuple[str, ...] = ()  # JAN.. or SUN..: names for low, low+1, ...


_CRON_FIELDS = (
    _CronField("minutes", 0, 59, ""),
    _CronField("hours", 0, 23, ""),
    _CronField("day-of-month", 1, 31, "?LW"),
    _CronField("month", 1, 12, "", ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG",
                                    "SEP", "OCT", "NOV", "DEC")),
    _CronField("day-of-week", 1, 7, "?L#", ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
    _CronField("year", 1970, 2199, ""),
)
_CRON_FORM = "minutes hours day-of-month month day-of-week year, e.g. '0 3 * * ? *'"


def _cron_value(spec: _CronField, text: str, whole: str) -> int:
    value: int
    if text.upper() in spec.names:
        value = spec.low + spec.names.index(text.upper())
    elif text.isdigit():
        value = int(text)
    else:
        raise InvalidSettings(f"cron {whole!r}: {spec.name} {text!r} is not a number"
                              + (f" or one of {', '.join(spec.names)}" if spec.names else ""))
    if not spec.low <= value <= spec.high:
        raise InvalidSettings(f"cron {whole!r}: {spec.name} {value} is outside "
                              f"{spec.low}-{spec.high}")
    return value


def _check_cron_part(spec: _CronField, part: str, whole: str) -> None:
    if part == "*":
        return
    if spec.name == "day-of-month" and re.fullmatch(r"L|LW|\d{1,2}W", part):
        if part[0].isdigit():
            _cron_value(spec, part[:-1], whole)
        return
    if spec.name == "day-of-week":
        special = re.fullmatch(r"(\w+)(L|#([1-5]))", part)
        if part == "L":
            return
        if special:
            _cron_value(spec, special.group(1), whole)
            return
    base, slash, step = part.partition("/")
    if slash and not (step.isdigit() and int(step) >= 1):
        raise InvalidSettings(f"cron {whole!r}: {spec.name} step {step!r} must be a whole "
                              f"number >= 1")
    if base == "*" and slash:
        return
    low, dash, high = base.partition("-")
    first = _cron_value(spec, low, whole)
    if dash and _cron_value(spec, high, whole) < first and spec.name != "day-of-week":
        raise InvalidSettings(f"cron {whole!r}: {spec.name} range {base!r} runs backwards")


def cron_expression(cron: str) -> str:
    """`cron(...)` of EventBridge's six cron fields (InvalidSettings naming the field at fault).

    Fields: minutes hours day-of-month month day-of-week year; exactly one of day-of-month
    and day-of-week is '?'. `cron(...)` around them is accepted too."""
    if not isinstance(cron, str):
        raise InvalidSettings(f"cron must be a string of six fields ({_CRON_FORM}), got {cron!r}")
    inner = cron.strip()
    if inner.startswith("cron(") and inner.endswith(")"):
        inner = inner[5:-1].strip()
    fields = inner.split()
    if len(fields) != len(_CRON_FIELDS):
        raise InvalidSettings(f"cron {cron!r} has {len(fields)} fields; EventBridge cron has 6: "
                              f"{_CRON_FORM}")
    for spec, field in zip(_CRON_FIELDS, fields):
        if field == "?":
            if "?" not in spec.specials:
                raise InvalidSettings(f"cron {cron!r}: '?' is for day-of-month or day-of-week, "
                                      f"not {spec.name}")
            continue
        for part in field.split(","):
            _check_cron_part(spec, part, cron)
    if (fields[2] == "?") == (fields[4] == "?"):
        raise InvalidSettings(f"cron {cron!r}: exactly one of day-of-month and day-of-week "
                              f"must be '?' ({_CRON_FORM})")
    return f"cron({' '.join(fields)})"


# -- what a schedule sends ----------------------------------------------------------------------
def target_input(kind: str, destination: str, body: str, attributes: Mapping[str, Any],
                 group_id: str | None = None, dedup_id: str | None = None) -> str:
    """The universal target's input: a SendMessage request (kind 'sqs', destination the queue
    URL) or a Publish request (kind 'sns', destination the topic ARN), as JSON."""
    if kind == "sqs":
        request: dict[str, Any] = {"QueueUrl": destination, "MessageBody": body}
    elif kind == "sns":
        request = {"TopicArn": destination, "Message": body}
    else:
        raise ValueError(f"kind must be 'sqs' or 'sns', got {kind!r}")
    if attributes:
        request["MessageAttributes"] = {name: dict(value) for name, value in attributes.items()}
    if group_id is not None:
        request["MessageGroupId"] = group_id
    if dedup_id is not None:
        request["MessageDeduplicationId"] = dedup_id
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False)


def target_arn(kind: str) -> str:
    return SEND_MESSAGE_TARGET if kind == "sqs" else PUBLISH_TARGET


def retry_policy() -> dict[str, int]:
    return {"MaximumRetryAttempts": RETRY_ATTEMPTS,
            "MaximumEventAgeInSeconds": MAX_EVENT_AGE_SECONDS}


# -- recurring jobs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RecurringSchedule:
    """A job pushed on a calendar (`cron`) or at a fixed interval (`rate`), deployed by CDK.

    name: 1-64 letters, digits, '-', '_', '.' (the schedule's name and its jobs' id prefix).
    expression: 'cron(...)' or 'rate(...)' (build with `RecurringSchedule.of`).
    timezone: IANA zone a cron expression is read in (default 'UTC'; rate ignores zones).
    body: the JSON body of every job. routing_key: the jobs' routing key (None: none)."""

    name: str
    expression: str
    timezone: str = "UTC"
    body: Any = None
    routing_key: str | None = None

    @classmethod
    def of(cls, name: str, *, cron: str | None = None, rate_seconds: float | None = None,
           timezone: str | None = None, body: Any = None,
           routing_key: str | None = None) -> RecurringSchedule:
        """Validate and build; one InvalidSettings naming what is wrong."""
        if not isinstance(name, str) or not _SCHEDULE_NAME.match(name):
            raise InvalidSettings(f"schedule name {name!r} must be 1-64 letters, digits, '-', "
                                  f"'_' or '.'")
        if (cron is None) == (rate_seconds is None):
            raise InvalidSettings(f"schedule {name!r}: give cron= or rate=, exactly one")
        if cron is not None:
            expression = cron_expression(cron)
            zone = "UTC" if timezone is None else timezone
            check_timezone(zone)
        else:
            if timezone is not None:
                raise InvalidSettings(f"schedule {name!r}: timezone applies to cron schedules; "
                                      f"a rate runs every interval whatever the zone")
            expression, zone = rate_expression(rate_seconds), "UTC"  # type: ignore[arg-type]
        try:
            json.dumps(body, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise InvalidSettings(f"schedule {name!r}: body must be JSON-serializable: "
                                  f"{error}") from None
        return cls(name, expression, zone, body, routing_key)

    @property
    def job_id(self) -> str:
        """Each firing's job id: '<name>@<scheduled time>' (Scheduler fills the time in)."""
        return f"{self.name}@{SCHEDULED_TIME}"

    def input(self, kind: str, destination: str, *, ordered: bool,
              group_id: str | None = None) -> str:
        """The universal target's input for the channel's queue (or topic): the body, the job
        id in `message_id`, the scheduled time in the `SCHEDULED_HEADER` meta header and,
        ordered, the group and the job id as deduplication id."""
        attributes = {MESSAGE_ID_ATTRIBUTE: {"DataType": "String", "StringValue": self.job_id},
                      META_HEADERS_ATTRIBUTE: {"DataType": "String", "StringValue": json.dumps(
                          {SCHEDULED_HEADER: SCHEDULED_TIME})}}
        if self.routing_key is not None:
            attributes[ROUTING_KEY_ATTRIBUTE] = {"DataType": "String",
                                                 "StringValue": self.routing_key}
        body = json.dumps(self.body, separators=(",", ":"), ensure_ascii=False)
        return target_input(kind, destination, body, attributes,
                            group_id if ordered else None, self.job_id if ordered else None)
