"""What a failure leaves behind (bounded cause, dead-letter note, status record) and the retry
policy (attempts per job, jittered exponential delays, validation)."""

from __future__ import annotations

import datetime
import json

import pytest

from messenger import Consumer, ConsumerSettings, InvalidChannelSpec, InvalidSettings, Settings
from messenger.consume.failures import (
    MAX_TRACEBACK_BYTES,
    HandlerFailure,
    RetryPolicy,
    failure_note,
)
from messenger.consume.lifecycle import LifecycleEvent
from messenger.consume.tracking import status_record
from messenger.jobs.status import StatusEvent, StatusRecord, render_timeline

SETTINGS = Settings(namespace="unit")


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:  # noqa: BLE001 - the test's own error
        return caught


def policy(**changes: object) -> RetryPolicy:
    values: dict[str, object] = dict(max_receives=5, max_attempts=None, retry_delay=10,
                                     retry_backoff=2, max_retry_delay=600)
    values.update(changes)
    return RetryPolicy(**values)  # type: ignore[arg-type]


def test_delays_double_per_attempt_each_drawn_between_half_and_all_and_capped():
    lowest = [policy().delay(n, draw=lambda: 0.0) for n in range(1, 9)]
    highest = [policy().delay(n, draw=lambda: 0.999999) for n in range(1, 9)]
    assert lowest == [5, 10, 20, 40, 80, 160, 300, 300]
    assert highest == [10, 20, 40, 80, 160, 320, 600, 600]
    assert policy(retry_backoff=1).delay(7, draw=lambda: 0.999999) == 10
    assert policy(retry_delay=0).delay(3) == 0
    assert policy().delay(10_000, draw=lambda: 0.5) == 450  # no overflow far out


def test_attempts_come_from_the_message_else_the_consumer_else_max_receives():
    def attributes(value: str) -> dict[str, dict[str, str]]:
        return {"max_attempts": {"DataType": "Number", "StringValue": value}}

    assert policy().attempts({}) == 5
    assert policy(max_attempts=2).attempts({}) == 2
    assert policy(max_attempts=2).attempts(attributes("4")) == 4
    assert policy().attempts(attributes("1")) == 1
    # never beyond the channel's max_receives (SQS's redrive would move it then anyway)
    assert policy().attempts(attributes("9")) == 5
    # an unreadable value is the consumer's default
    assert policy(max_attempts=3).attempts(attributes("many")) == 3
    assert policy(max_attempts=3).attempts(attributes("0")) == 3


def test_a_failure_keeps_the_last_4_kib_of_its_traceback_cut_at_a_character():
    failure = HandlerFailure.of(raised(ValueError("é" * 5000)))
    assert failure.error_type == "ValueError"
    assert failure.error_message == "é" * 1024
    assert failure.traceback.startswith("...\n")
    assert len(failure.traceback.encode()) <= MAX_TRACEBACK_BYTES + 4
    assert failure.traceback.endswith("é" * 100 + "\n")
    short = HandlerFailure.of(raised(KeyError("sku")))
    assert short.traceback.startswith("Traceback (most recent call last):")
    assert short.fields() == {"error": "KeyError: 'sku'", "error_class": "KeyError",
                              "traceback": short.traceback}


def test_the_failure_note_is_ascii_json_with_error_fields_only_for_a_handler_failure():
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
    failure = HandlerFailure.of(raised(RuntimeError("naïve \x00 bytes")))
    note = failure_note(3, "host-1", failure, at=at)
    assert note.isascii()
    assert json.loads(note) == {
        "error_type": "RuntimeError", "error_message": "naïve \x00 bytes",
        "traceback": failure.traceback, "attempts": 3, "at": "2026-01-02T03:04:05.678+00:00",
        "consumer": "host-1",
    }
    timed_out = json.loads(failure_note(1, "host-1"))
    assert set(timed_out) == {"attempts", "at", "consumer"}
    assert datetime.datetime.fromisoformat(timed_out["at"]).utcoffset() == datetime.timedelta(0)


def test_a_failed_status_record_keeps_the_traceback_and_the_timeline_shows_the_last():
    failure = HandlerFailure.of(raised(ValueError("bad sku")))
    event = LifecycleEvent("failed", "orders", "m1", 0.5,
                           {**failure.fields(), "receive_count": 2}, at=100.0)
    record = status_record(event, "host-1")
    assert record is not None
    assert (record.error_class, record.error) == ("ValueError", "bad sku")
    assert record.traceback == failure.traceback
    assert StatusRecord.from_item(record.item(3600)) == record
    shown = render_timeline("m1", [record, StatusRecord(
        "m1", StatusEvent.DEAD_LETTERED, "orders", at=101.0,
        error="failed: attempts used up (2 of 2)")]).splitlines()
    assert shown[shown.index("last failure's traceback:") + 1:][-1] == "    ValueError: bad sku"


class Jobs(Consumer):
    channel = "jobs"

    def handler(self, message: object) -> None:
        pass


@pytest.mark.parametrize(("changes", "pattern"), [
    ({"max_attempts": 0}, r"Jobs.max_attempts must be a whole number from 1 to 3 "
                          r"\(Jobs.max_receives\), got 0"),
    ({"max_attempts": 2.0}, r"Jobs.max_attempts must be a whole number from 1 to 3"),
    ({"max_attempts": 6, "max_receives": 5}, r"from 1 to 5 \(Jobs.max_receives\), got 6"),
    ({"retry_delay": -1}, r"Jobs.retry_delay must be a number from 0 to 43200 seconds"),
    ({"retry_backoff": 0.5}, r"Jobs.retry_backoff must be a number from 1 to 100, got 0.5"),
    ({"retry_backoff": True}, r"Jobs.retry_backoff must be a number from 1 to 100"),
    ({"max_retry_delay": 2, "retry_delay": 5},
     r"Jobs.max_retry_delay must be a number from 5 to 43200 seconds \(at least "
     r"Jobs.retry_delay\), got 2"),
])
def test_retry_policy_attributes_are_validated_naming_the_field(changes, pattern):
    cls = type("Jobs", (Jobs,), changes)
    with pytest.raises(InvalidChannelSpec, match=pattern):
        cls(settings=SETTINGS)


def test_the_runtime_retry_delay_wins_over_the_class_and_is_validated():
    class Patient(Jobs):
        max_attempts = 2
        retry_delay = 30
        retry_backoff = 3

    assert Patient(settings=SETTINGS).retry_policy == RetryPolicy(3, 2, 30, 3, 600)
    quick = Patient(settings=SETTINGS, runtime=ConsumerSettings(retry_delay=0))
    assert quick.retry_policy.delay(2) == 0
    with pytest.raises(InvalidSettings, match="retry_delay must be a finite number of seconds"):
        ConsumerSettings(retry_delay=float("nan"))
