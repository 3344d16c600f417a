"""Scheduled jobs without AWS: routing, names, expressions, recurring jobs, offload expiry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from messenger.errors import InvalidMessage, InvalidSettings
from messenger.jobs.schedules import (
    SCHEDULED_HEADER,
    SCHEDULED_TIME,
    RecurringSchedule,
    at_expression,
    channel_key,
    channel_prefix,
    cron_expression,
    job_key,
    parse_at,
    plan_delivery,
    rate_expression,
    schedule_name,
    target_input,
)
from messenger.message import EncodedMessage
from messenger.produce.scheduled import check_offload_horizon, offload_deadline
from messenger.tools.scheduler_fire import context_input

NOW = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


def plan(at=None, delay=None, ordered=False, fanout=False):
    return plan_delivery(at, delay, ordered=ordered, fanout=fanout, now=NOW)


# -- routing ---------------------------------------------------------------------------------
def test_no_time_sends_now():
    assert plan() is None
    assert plan(delay=0) is None
    assert plan(delay=timedelta(0)) is None


@pytest.mark.parametrize("delay", [1, 60.2, timedelta(minutes=15)])
def test_up_to_15_minutes_on_a_standard_queue_is_delay_seconds(delay):
    delivery = plan(delay=delay)
    assert delivery is not None and not delivery.scheduled
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    assert delivery.delay_seconds == -(-seconds // 1)  # rounded up: never early
    assert delivery.due == NOW + timedelta(seconds=delivery.delay_seconds)


def test_an_at_within_15_minutes_on_a_standard_queue_is_delay_seconds_too():
    delivery = plan(at=NOW + timedelta(minutes=10))
    assert delivery is not None and delivery.delay_seconds == 600


def test_beyond_15_minutes_is_a_schedule_due_in_utc():
    delivery = plan(delay=timedelta(minutes=15, seconds=1))
    assert delivery is not None and delivery.scheduled
    berlin = datetime(2026, 12, 1, 9, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    delivery = plan(at=berlin)
    assert delivery is not None and delivery.scheduled
    assert delivery.expression == "at(2026-12-01T08:00:00)"


@pytest.mark.parametrize("kwargs", [{"ordered": True}, {"fanout": True}])
def test_any_delay_on_an_ordered_channel_or_an_exchange_is_a_schedule(kwargs):
    assert plan(delay=1, **kwargs).scheduled
    assert plan(at=NOW + timedelta(seconds=30), **kwargs).scheduled


def test_a_schedule_is_due_no_earlier_than_asked_from_a_fractional_now():
    # Given a push at 12:00:00.7 asking for 3 s (or 12:00:03.2) on an exchange
    now = NOW + timedelta(milliseconds=700)
    for at, delay in ((None, 3), (NOW + timedelta(seconds=3, milliseconds=200), None)):
        due = plan_delivery(at, delay, ordered=False, fanout=True, now=now).due
        # Then its whole-second at(...) is the second after, never the one before
        assert due == NOW + timedelta(seconds=4)
        assert due >= now + timedelta(seconds=3)


def test_a_whole_second_at_keeps_its_second_from_a_fractional_now():
    # Given a push at 12:00:00.7 for 12:05:00 exactly, on a standard channel and on an exchange
    now = NOW + timedelta(milliseconds=700)
    at = NOW + timedelta(minutes=5)
    for fanout in (False, True):
        planned = plan_delivery(at, None, ordered=False, fanout=fanout, now=now)
        # Then it is due at 12:05:00, not a second later (the delay rounded up, not the time)
        assert planned.due == at
    # And DelaySeconds covers the whole wait: never earlier than asked
    assert plan_delivery(at, None, ordered=False, fanout=False, now=now).delay_seconds == 300


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"at": NOW, "delay": 5}, "at= or delay=, not both"),
        ({"at": datetime(2026, 12, 1, 9, 0)}, "has no time zone"),
        ({"at": NOW - timedelta(seconds=1)}, "is in the past"),
        ({"at": "2026-12-01"}, "at must be a datetime"),
        ({"delay": -5}, "must not be negative"),
        ({"delay": "5"}, "delay must be a timedelta or seconds"),
        ({"delay": float("nan")}, "delay must be a timedelta or seconds"),
        ({"delay": True}, "delay must be a timedelta or seconds"),
    ],
)
def test_bad_times_have_one_clear_error_each(kwargs, message):
    with pytest.raises(InvalidMessage, match=message):
        plan(**kwargs)


# -- names and ids -------------------------------------------------------------------------------
def test_schedule_names_carry_the_channel_and_the_job_id():
    assert schedule_name("orders", "0123abcd") == "orders.0123abcd"
    assert channel_prefix("orders") == "orders."
    long_channel = "a_really_long_channel_name_for_reports"
    assert len(channel_key(long_channel)) == 24
    assert channel_key(long_channel) != channel_key(long_channel + "2")
    # An id with characters a schedule name refuses, or too long, is named by its hash
    odd = job_key("order#42/retry")
    assert odd.startswith("h") and odd == job_key("order#42/retry")
    assert len(schedule_name(long_channel, "x" * 128)) <= 64


def test_the_target_input_is_the_send_message_request():
    attributes = {"message_id": {"DataType": "String", "StringValue": "j1"}}
    request = json.loads(target_input("sqs", "https://q/url", '{"a":1}', attributes,
                                      "g", "d"))
    assert request == {"QueueUrl": "https://q/url", "MessageBody": '{"a":1}',
                       "MessageAttributes": attributes, "MessageGroupId": "g",
                       "MessageDeduplicationId": "d"}
    published = json.loads(target_input("sns", "arn:aws:sns:r:1:t", "{}", {}))
    assert published == {"TopicArn": "arn:aws:sns:r:1:t", "Message": "{}"}


def test_a_recurring_job_id_derives_from_the_scheduled_time():
    nightly = RecurringSchedule.of("nightly-report", cron="0 3 * * ? *",
                                   timezone="Europe/Berlin", body={"kind": "daily"})
    assert nightly.job_id == f"nightly-report@{SCHEDULED_TIME}"
    request = json.loads(nightly.input("sqs", "https://q", ordered=True, group_id="reports"))
    assert request["MessageAttributes"]["message_id"]["StringValue"] == nightly.job_id
    assert request["MessageDeduplicationId"] == nightly.job_id
    # Given Scheduler fills the time in, two firings are two jobs and a retry is the same one
    first = context_input(nightly.input("sqs", "q", ordered=False), "arn",
                          datetime(2026, 11, 25, 2, 0, tzinfo=UTC), 1)
    retry = context_input(nightly.input("sqs", "q", ordered=False), "arn",
                          datetime(2026, 11, 25, 2, 0, tzinfo=UTC), 2)
    second = context_input(nightly.input("sqs", "q", ordered=False), "arn",
                           datetime(2026, 11, 26, 2, 0, tzinfo=UTC), 1)
    ids = [json.loads(r)["MessageAttributes"]["message_id"]["StringValue"]
           for r in (first, retry, second)]
    assert ids[0] == ids[1] == "nightly-report@2026-11-25T02:00:00Z" != ids[2]
    # And each firing is marked as the scheduler's, with its scheduled time (the consumer
    # claims such a job once: jobs.fired)
    headers = json.loads(json.loads(first)["MessageAttributes"]["meta_headers"]["StringValue"])
    assert headers == {SCHEDULED_HEADER: "2026-11-25T02:00:00Z"}


# -- expressions ---------------------------------------------------------------------------------
def test_at_expressions_round_trip_in_utc():
    due = datetime(2026, 12, 1, 8, 0, 5, tzinfo=UTC)
    assert at_expression(due) == "at(2026-12-01T08:00:05)"
    assert parse_at(at_expression(due)) == due
    assert parse_at("at(2026-12-01T09:00:05)", "Europe/Berlin") == due
    assert parse_at("rate(1 hour)") is None


@pytest.mark.parametrize(
    ("cron", "expression"),
    [
        ("0 3 * * ? *", "cron(0 3 * * ? *)"),
        ("cron(0/15 8-17 ? * MON-FRI *)", "cron(0/15 8-17 ? * MON-FRI *)"),
        ("0 12 L * ? 2027", "cron(0 12 L * ? 2027)"),
        ("30 6 ? JAN,JUL 2#1 *", "cron(30 6 ? JAN,JUL 2#1 *)"),
        ("0 0 15W * ? *", "cron(0 0 15W * ? *)"),
    ],
)
def test_good_cron_expressions(cron, expression):
    assert cron_expression(cron) == expression


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 3 * * *", "has 5 fields; EventBridge cron has 6"),
        ("0 3 * * * *", "exactly one of day-of-month and day-of-week must be '?'"),
        ("0 3 ? * ? *", "exactly one of day-of-month and day-of-week must be '?'"),
        ("61 3 * * ? *", "minutes 61 is outside 0-59"),
        ("0 24 * * ? *", "hours 24 is outside 0-23"),
        ("0 3 * FOO ? *", "month 'FOO' is not a number or one of JAN"),
        ("? 3 * * ? *", "'?' is for day-of-month or day-of-week, not minutes"),
        ("0/0 3 * * ? *", "minutes step '0' must be a whole number >= 1"),
        ("0 20-5 * * ? *", "hours range '20-5' runs backwards"),
    ],
)
def test_bad_cron_expressions_have_one_clear_error_each(cron, message):
    with pytest.raises(InvalidSettings, match=message.replace("?", r"\?").replace("(", r"\(")):
        cron_expression(cron)


def test_rates_are_whole_minutes():
    assert rate_expression(3600) == "rate(1 hour)"
    assert rate_expression(300) == "rate(5 minutes)"
    assert rate_expression(2 * 86_400) == "rate(2 days)"
    for bad in (30, 90, 0, float("inf")):
        with pytest.raises(InvalidSettings, match="whole number of minutes"):
            rate_expression(bad)


def test_recurring_schedule_validation():
    assert RecurringSchedule.of("hourly", rate_seconds=3600).expression == "rate(1 hour)"
    with pytest.raises(InvalidSettings, match="unknown time zone 'Europe/Berlinn'"):
        RecurringSchedule.of("n", cron="0 3 * * ? *", timezone="Europe/Berlinn")
    with pytest.raises(InvalidSettings, match="give cron= or rate=, exactly one"):
        RecurringSchedule.of("n")
    with pytest.raises(InvalidSettings, match="timezone applies to cron schedules"):
        RecurringSchedule.of("n", rate_seconds=3600, timezone="Europe/Berlin")
    with pytest.raises(InvalidSettings, match="schedule name 'a b'"):
        RecurringSchedule.of("a b", rate_seconds=3600)
    with pytest.raises(InvalidSettings, match="body must be JSON-serializable"):
        RecurringSchedule.of("n", rate_seconds=3600, body={"x": object()})


# -- offloaded bodies ----------------------------------------------------------------------------
def test_an_offloaded_body_must_outlive_the_job_and_its_retention():
    offloaded = EncodedMessage("[pointer]", {"ExtendedPayloadSize": {"DataType": "Number",
                                                                      "StringValue": "9"}})
    inline = EncodedMessage("{}", {})
    latest = offload_deadline(NOW)
    assert latest == NOW + timedelta(days=1)  # 29 days of lifecycle less 2 x 14 of retention
    check_offload_horizon(offloaded, latest, NOW)
    check_offload_horizon(inline, NOW + timedelta(days=300), NOW)
    with pytest.raises(InvalidMessage, match=r"due 2026-11-25 12:00:01 UTC.*expires 2026-12-23"):
        check_offload_horizon(offloaded, latest + timedelta(seconds=1), NOW)
