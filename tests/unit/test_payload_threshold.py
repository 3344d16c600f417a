"""The default offload threshold is the one that costs least in dollars for each kind of channel
(the price table's), and producers use it unless a setting or their class says otherwise."""

from __future__ import annotations

import pytest

from messenger import MultiProducer, Producer, Settings
from messenger.aws import ClientFactory
from messenger.channel import SNS_MAX_MESSAGE_BYTES, SQS_MAX_MESSAGE_BYTES
from messenger.offload import DEFAULT_THRESHOLDS, default_threshold
from messenger.ops.payload_cost import (
    KINDS,
    cheapest_threshold,
    inline_usage,
    offloaded_usage,
    per_million,
)
from messenger.ops.prices import PRICES, Price

KIB = 1024


def test_the_defaults_are_what_the_price_table_makes_cheapest() -> None:
    assert DEFAULT_THRESHOLDS == {name: cheapest_threshold(kind) for name, kind in KINDS.items()}
    # SQS (standard and FIFO): inline up to its 1 MiB maximum; SNS topics take 256 KiB
    assert DEFAULT_THRESHOLDS == {"sqs": SQS_MAX_MESSAGE_BYTES, "sqs_fifo": SQS_MAX_MESSAGE_BYTES,
                                  "sns": SNS_MAX_MESSAGE_BYTES}


def test_a_300_kib_message_costs_less_inline_than_through_s3() -> None:
    # 5 chunks sent and 5 received plus the delete at $0.40/M, against a PUT ($5/M), a GET,
    # 3 requests and 29 days of 300 KiB in S3
    sqs = KINDS["sqs"]
    assert per_million(inline_usage(sqs, 300 * KIB)) == pytest.approx(11 * 0.40)
    offloaded = per_million(offloaded_usage(sqs, 300 * KIB))
    assert offloaded == pytest.approx(3 * 0.40 + 5.0 + 0.40 + 300 / 1024**2 * 29 * 24 / 730
                                      * 0.023 * 1e6)
    assert per_million(inline_usage(sqs, 300 * KIB)) < offloaded


def test_the_choice_moves_with_the_prices() -> None:
    # If S3 PUTs and storage were free, offloading would win past the first 64 KiB chunk
    free = {**PRICES, "s3.put": Price(0.0, 1, "", ""), "s3.gb_month": Price(0.0, 1, "", "")}
    sqs = KINDS["sqs"]
    assert cheapest_threshold(sqs, prices=free) == 64 * KIB
    # Without storage (objects deleted on consume, as the extended client does) but with the
    # PUT, SQS's inline chunks would cost more than S3 past 448 KiB
    no_storage = {**PRICES, "s3.gb_month": Price(0.0, 1, "", "")}
    assert cheapest_threshold(sqs, prices=no_storage) == 448 * KIB


@pytest.mark.parametrize(("base", "ordered", "expected"), [
    (Producer, False, SQS_MAX_MESSAGE_BYTES),
    (Producer, True, SQS_MAX_MESSAGE_BYTES),
    (MultiProducer, False, SNS_MAX_MESSAGE_BYTES),
    (MultiProducer, True, SNS_MAX_MESSAGE_BYTES),
])
def test_producers_default_to_their_channel_kinds_threshold(
    base: type, ordered: bool, expected: int
) -> None:
    producer_class = type("Sized", (base,), {"channel": "sized", "ordered": ordered})
    producer = producer_class(settings=Settings(), clients=ClientFactory("us-east-1"))
    assert producer.threshold == expected == default_threshold(base is MultiProducer, ordered)
    # A setting still decides (capped at what the channel carries), and a class's own value
    configured = producer_class(settings=Settings(offload_threshold=300 * KIB),
                                clients=ClientFactory("us-east-1"))
    assert configured.threshold == min(300 * KIB, expected)
    own = type("Own", (producer_class,), {"offload_threshold": 100 * KIB})(
        settings=Settings(), clients=ClientFactory("us-east-1"))
    assert own.threshold == 100 * KIB


def test_the_setting_is_unset_by_default_and_survives_the_environment() -> None:
    assert Settings().offload_threshold is None
    assert Settings.from_env({}).offload_threshold is None
    assert Settings.from_env({"MESSENGER_OFFLOAD_THRESHOLD": ""}).offload_threshold is None
    assert Settings.from_env(Settings().as_env()) == Settings()
    assert Settings.from_env({"MESSENGER_OFFLOAD_THRESHOLD": "70000"}).offload_threshold == 70000
