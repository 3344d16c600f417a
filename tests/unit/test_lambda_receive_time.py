"""How long ago Lambda's poller received a record: a bound never shorter than the truth.

SQS counts its 12 hours in flight from the receive, and Lambda invokes after it (a batching
window of up to 5 minutes): a retry delay computed from the invocation's start alone asked SQS
for more than it allows, and the retry failed (seen on a loaded machine, where the local event
source's receive and the invocation were seconds apart)."""

from __future__ import annotations

import time

import pytest

from messenger.consume.failures import MAX_RETRY_DELAY_SECONDS
from messenger.consume.lambda_runtime import CLOCK_SKEW_SECONDS, seconds_since_receive


def record(first_receive_seconds_ago: float | None) -> dict:
    attributes = {"ApproximateReceiveCount": "1"}
    if first_receive_seconds_ago is not None:
        attributes["ApproximateFirstReceiveTimestamp"] = str(
            int((time.time() - first_receive_seconds_ago) * 1000))
    return {"messageId": "m", "attributes": attributes}


def test_a_first_delivery_counts_from_its_receive_plus_the_clock_skew() -> None:
    # Given a record first received 100 s ago (a batching window), a visibility of 15 minutes
    held = seconds_since_receive(record(100), visibility_timeout=900)
    # Then it counts as received at least that long ago, never less
    assert 100 + CLOCK_SKEW_SECONDS - 0.01 <= held <= 100 + CLOCK_SKEW_SECONDS + 1.0


def test_a_redelivery_is_bounded_by_the_visibility_timeout() -> None:
    # Given a record first received an hour ago (this is a later receive): the record is still
    # ours, so this receive is less than one visibility timeout old
    assert seconds_since_receive(record(3600), visibility_timeout=30) == 30


@pytest.mark.parametrize("first", [None, "soon", ""])
def test_without_a_usable_timestamp_the_visibility_timeout_bounds_it(first: object) -> None:
    entry = record(None)
    if first is not None:
        entry["attributes"]["ApproximateFirstReceiveTimestamp"] = first
    assert seconds_since_receive(entry, visibility_timeout=45) == 45


def test_a_timestamp_ahead_of_this_clock_counts_as_no_time() -> None:
    assert seconds_since_receive(record(-60), visibility_timeout=45) == 0.0


def test_the_capped_retry_delay_stays_within_12_hours_of_the_receive() -> None:
    # Given a record received 200 s before the invocation: the delay a runtime may still ask
    # for is 12 hours less what the bound counts, which is at least the 200 s that passed
    held = seconds_since_receive(record(200), visibility_timeout=900)
    assert 200 + (MAX_RETRY_DELAY_SECONDS - held) <= MAX_RETRY_DELAY_SECONDS
