"""Scheduled pushes at their edges, without AWS: the one `at`/`delay` range, 900 s as SQS's
DelaySeconds, collision-free schedule names, the offload decision on the schedule's input."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from messenger.errors import InvalidMessage
from messenger.jobs.schedules import (
    MAX_AHEAD,
    MAX_AHEAD_SECONDS,
    job_key,
    legacy_job_key,
    plan_delivery,
    schedule_name,
)
from messenger.message import EncodedMessage
from messenger.produce.scheduled import SCHEDULER_MAX_INPUT_BYTES, needs_offload
from messenger.produce.transport import OutgoingMessage

#: A push's clock is never on a whole second: the cases below run from a fractional now.
NOW = datetime(2026, 11, 24, 12, 0, 0, 300_000, tzinfo=UTC)


def plan(at=None, delay=None, ordered=False, fanout=False):
    return plan_delivery(at, delay, ordered=ordered, fanout=fanout, now=NOW)


# -- one range for `at` and `delay` (item 3) ---------------------------------------------------
def test_the_range_is_366_days_for_at_and_delay_alike():
    assert MAX_AHEAD_SECONDS == 366 * 86_400 == MAX_AHEAD.total_seconds()
    # Both ends are in: the last second of the range is a schedule, one more is refused
    assert plan(delay=MAX_AHEAD_SECONDS).scheduled
    assert plan(at=NOW + MAX_AHEAD).scheduled
    with pytest.raises(InvalidMessage, match=r"^delay=31622401 is too long: delay must be 0 "
                                             r"to 31622400 seconds \(366 days\)$"):
        plan(delay=MAX_AHEAD_SECONDS + 1)
    with pytest.raises(InvalidMessage, match=r"^at=2027-11-25T12:00:01\.300000\+00:00 is too "
                                             r"far ahead: at must be from now to 366 days "
                                             r"from now \(by 2027-11-25T12:00:00\+00:00\)$"):
        plan(at=NOW + MAX_AHEAD + timedelta(seconds=1))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"at": datetime.max.replace(tzinfo=UTC)}, "at"),
    ({"at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-23, minutes=-59)))}, "at"),
    ({"at": datetime(2099, 1, 1, tzinfo=UTC)}, "at"),
    ({"delay": timedelta.max}, "delay"),
    ({"delay": 10**400}, "delay"),  # float() of it overflows
    ({"delay": 1e300}, "delay"),
    ({"delay": timedelta(days=367)}, "delay"),
])
def test_times_beyond_the_range_are_invalid_messages_not_overflow_errors(kwargs, field):
    # Given a time the range does not hold (datetime.max, timedelta.max gave OverflowError)
    with pytest.raises(InvalidMessage) as refused:
        plan(**kwargs)
    # Then one line names the field and the range
    assert str(refused.value).startswith(f"{field}=")
    assert "366 days" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_huge_negative_delays_are_negative_not_overflow_errors():
    with pytest.raises(InvalidMessage, match="delay must not be negative"):
        plan(delay=-(10**400))
    with pytest.raises(InvalidMessage, match="delay must not be negative"):
        plan(delay=timedelta.min)


# -- 900 s is SQS's DelaySeconds (item 4) -------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"delay": 900}, {"delay": 900.0},
                                    {"delay": timedelta(seconds=900)},
                                    {"at": NOW + timedelta(seconds=900)}])
def test_a_wait_of_900_seconds_is_delay_seconds_from_a_fractional_now(kwargs):
    # Given a push at 12:00:00.3 asking for exactly 900 s (SQS's maximum, inclusive)
    delivery = plan(**kwargs)
    # Then SQS's DelaySeconds carries it, not a schedule rounded up to 901 s
    assert delivery is not None and not delivery.scheduled
    assert delivery.delay_seconds == 900
    # And it is never early: the due time is at or after the time asked for
    assert delivery.due >= NOW + timedelta(seconds=900)


def test_a_wait_past_900_seconds_is_a_schedule():
    assert plan(delay=900.001).scheduled
    assert plan(delay=901).scheduled
    assert plan(delay=900, ordered=True).scheduled  # FIFO: no per-message delay
    assert plan(delay=900, fanout=True).scheduled  # SNS: no delay


# -- collision-free names (item 12) -----------------------------------------------------------
def test_an_id_shaped_like_another_ids_hash_has_its_own_schedule_name():
    # Given an id named by its hash, and an id that is 'h' + the first 38 hex digits of it
    hashed = "report/7"
    lookalike = "h" + hashlib.sha256(hashed.encode()).hexdigest()[:38]
    # Then their schedule names differ (before, both were 'reports.<lookalike>')
    assert schedule_name("reports", hashed) != schedule_name("reports", lookalike)
    assert schedule_name("reports", lookalike) == f"reports.{lookalike}"
    # And a hashed key holds a '.', which a kept id never does, so no id names another's hash
    assert job_key(hashed).startswith("h.") and len(job_key(hashed)) == 39
    assert "." not in job_key(lookalike)
    # And the old name is known, so a job scheduled before is still found (and checked)
    assert legacy_job_key(hashed) == lookalike
    assert legacy_job_key(lookalike) is None
    assert len(schedule_name("a_really_long_channel_name_for_reports", "x" * 128)) <= 64


# -- the offload decision on the schedule's input (item 5) -------------------------------------
def test_a_body_of_quotes_is_offloaded_on_its_schedules_input_size():
    # Given 70,000 '"': 140,002 bytes once encoded (below Scheduler's 256 KB and the default
    # offload threshold), 280,000 bytes once escaped again inside the schedule's input
    body = json.dumps('"' * 70_000)
    assert len(body) == 140_002 < SCHEDULER_MAX_INPUT_BYTES
    quotes = OutgoingMessage(EncodedMessage(body, {}), None, None)
    due = datetime(2026, 11, 24, 13, 0, tzinfo=UTC)
    # Then the schedule's input decides: offload it
    assert needs_offload("sqs", quotes, due)
    # And a body of the same size that escapes to itself does not need it
    plain = OutgoingMessage(EncodedMessage(json.dumps("x" * 139_998), {}), None, None)
    assert not needs_offload("sqs", plain, due)
