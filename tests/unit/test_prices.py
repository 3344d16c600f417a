"""The price table and the dollar arithmetic on fixed request counts (checked by hand)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from messenger.ops.cost import Estimate, WireMeter, estimate
from messenger.ops.inventory import PlatformResource
from messenger.ops.prices import PRICES, PRICES_CHECKED, Usage, chunks, price_table


def test_every_price_names_its_aws_page_and_the_table_is_dated() -> None:
    for key, price in PRICES.items():
        assert price.source.startswith("https://aws.amazon.com/"), key
        assert price.dollars >= 0 and price.per > 0, key
    assert PRICES_CHECKED.year >= 2026
    assert {row["checked"] for row in price_table()} == {PRICES_CHECKED.isoformat()}


def test_a_million_of_each_request_costs_its_list_price() -> None:
    # SQS $0.40, SNS $0.50, Lambda $0.20 per million; KMS $0.03 per 10,000 ($3 per million);
    # DynamoDB on-demand $0.625 per million writes, $0.125 per million reads
    usage = Usage({"sqs.request": 1e6, "sns.publish": 1e6, "lambda.request": 1e6,
                   "kms.request": 1e6, "dynamodb.write_unit": 1e6, "dynamodb.read_unit": 1e6})
    dollars = usage.dollars()
    assert dollars == pytest.approx({"sqs.request": 0.40, "sns.publish": 0.50,
                                     "lambda.request": 0.20, "kms.request": 3.0,
                                     "dynamodb.write_unit": 0.625, "dynamodb.read_unit": 0.125})
    assert usage.total_dollars() == pytest.approx(4.85)


def test_compute_and_storage() -> None:
    # 0.25 vCPU and 0.5 GB for 720 hours; 1,000 GB-seconds of Lambda; 10 GB kept a month
    usage = Usage({"fargate.vcpu_hour": 0.25 * 720, "fargate.gb_hour": 0.5 * 720,
                   "lambda.gb_second": 1000, "s3.gb_month": 10, "s3.put": 1000, "s3.get": 1000})
    assert usage.total_dollars() == pytest.approx(
        0.25 * 720 * 0.04048 + 0.5 * 720 * 0.004445 + 1000 * 0.0000166667 + 10 * 0.023
        + 0.005 + 0.0004)


def test_usage_refuses_a_key_without_a_price() -> None:
    with pytest.raises(KeyError, match="no price for 'sqs.requests'"):
        Usage().add("sqs.requests")


@pytest.mark.parametrize(("size", "billed"), [(0, 1), (1, 1), (65_536, 1), (65_537, 2),
                                               (262_144, 4)])
def test_sqs_and_sns_bill_each_started_64_kib(size: int, billed: int) -> None:
    assert chunks(size) == billed


def _send(meter: WireMeter, event: str, body: dict | bytes | str) -> None:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    meter.before_send(request=SimpleNamespace(body=data, headers={}),
                      event_name=f"before-send.{event}")


def test_the_wire_meter_bills_a_fixed_set_of_requests() -> None:
    # Given 10 sends of a small message, one batch of 10, a 100 KiB send, a receive that
    # returned 200 KiB, 3 small DynamoDB writes, a batch write of 25 items, a consistent read,
    # 2 S3 puts of 600 KiB, one get and one delete, 4 KMS calls and 2 SNS publishes
    meter = WireMeter()
    url = {"QueueUrl": "http://localhost/000000000000/orders"}
    for _ in range(10):
        _send(meter, "sqs.SendMessage", {**url, "MessageBody": "x" * 200})
    _send(meter, "sqs.SendMessageBatch", {**url, "Entries": [{"MessageBody": "x"}] * 10})
    _send(meter, "sqs.SendMessage", {**url, "MessageBody": "x" * 100 * 1024})
    _send(meter, "sqs.ReceiveMessage", url)
    receive: dict = {}  # botocore's request context: the same dict at both events
    meter.remember_params(params=url, context=receive)
    meter.after_call(http_response=SimpleNamespace(content=b"x" * 200 * 1024),
                     context=receive, event_name="after-call.sqs.ReceiveMessage")
    fifo = {"QueueUrl": "http://localhost/000000000000/orders.fifo", "MessageBody": "x"}
    _send(meter, "sqs.SendMessage", fifo)
    for _ in range(3):
        _send(meter, "dynamodb.PutItem", {"TableName": "t", "Item": {"id": {"S": "1"}}})
    _send(meter, "dynamodb.BatchWriteItem", {"RequestItems": {"t": [
        {"PutRequest": {"Item": {"id": {"S": str(n)}}}} for n in range(25)]}})
    _send(meter, "dynamodb.GetItem", {"TableName": "t"})
    read: dict = {}
    meter.remember_params(params={"TableName": "t", "ConsistentRead": True}, context=read)
    meter.after_call(http_response=SimpleNamespace(content=b"{}"),
                     context=read, event_name="after-call.dynamodb.GetItem")
    for _ in range(2):
        meter.before_send(request=SimpleNamespace(body=b"", headers={
            "Content-Length": str(600 * 1024)}), event_name="before-send.s3.PutObject")
    _send(meter, "s3.GetObject", b"")
    _send(meter, "s3.DeleteObject", b"")
    for _ in range(4):
        _send(meter, "kms.GenerateDataKey", {})
    for _ in range(2):
        _send(meter, "sns.Publish", "Action=Publish&Message=hi")

    # Then it bills: SQS 10 + 1 + 2 (100 KiB) + 4 (a receive of 200 KiB) = 17 standard and
    # 1 FIFO request; 3 + 25 write units, 1 read unit; 2 PUTs, 1 GET; 4 KMS calls; 2 publishes
    assert meter.usage == {"sqs.request": 17, "sqs.fifo_request": 1,
                           "dynamodb.write_unit": 28, "dynamodb.read_unit": 1, "s3.put": 2,
                           "s3.get": 1, "kms.request": 4, "sns.publish": 2}
    assert meter.s3_bytes_put == 2 * 600 * 1024
    assert meter.total_requests == 29
    # and dollars, by hand: 17 x 0.40e-6 + 0.50e-6 + 28 x 0.625e-6 + 0.125e-6 + 2 x 5e-6
    # + 0.4e-6 + 4 x 3e-6 + 2 x 0.50e-6
    assert meter.usage.total_dollars() == pytest.approx(
        17 * 0.40e-6 + 0.50e-6 + 28 * 0.625e-6 + 0.125e-6 + 2 * 5e-6 + 0.4e-6 + 4 * 3e-6
        + 2 * 0.50e-6)


def test_a_channels_estimate_from_its_metrics_is_a_range() -> None:
    # Given a queue that got 100 messages, handed out 100, deleted 100 and answered 40 empty
    # receives, of 100 KiB on average (2 chunks each), and a topic with 100 publishes
    queue = PlatformResource("arn:aws:sqs:us-east-1:1:orders", {})
    topic = PlatformResource("arn:aws:sns:us-east-1:1:events", {})
    sums = {"orders": {"NumberOfMessagesSent": 100, "NumberOfMessagesReceived": 100,
                       "NumberOfMessagesDeleted": 100, "NumberOfEmptyReceives": 40,
                       "SentMessageSize": 100 * 1024},
            "events": {"NumberOfMessagesPublished": 100, "NumberOfNotificationsDelivered": 100}}
    found = estimate([queue, topic], sums)
    # Then low: 40 + 2 x (10 + 10 + 10) SQS and 10 publishes; high: 40 + 2 x 300 and 100
    assert isinstance(found, Estimate)
    assert (found.requests_low, found.requests_high) == (110, 740)
    assert found.dollars_low == pytest.approx(100 * 0.40e-6 + 10 * 0.50e-6)
    assert found.dollars_high == pytest.approx(640 * 0.40e-6 + 100 * 0.50e-6)


def test_the_fleet_model_of_bench_dollars() -> None:
    from bench.dollars import fargate, lambda_consumer

    # 1,000 jobs/s at 237 µs each: 0.237 vCPU, 2 tasks of 0.25 vCPU at 70%; a million jobs
    # take 1,000 s: 2 x 0.25 vCPU x 1,000/3,600 h and 2 x 0.5 GB likewise
    usage = fargate(237e-6, 1000)
    assert usage == pytest.approx({"fargate.vcpu_hour": 0.5 * 1000 / 3600,
                                   "fargate.gb_hour": 1.0 * 1000 / 3600})
    # at 10 jobs/s one task, whatever its load: 100,000 s for a million jobs
    assert fargate(1e-6, 10)["fargate.vcpu_hour"] == pytest.approx(0.25 * 100_000 / 3600)
    # Lambda, batches of 10 taking 0.6 ms (billed 1 ms) at 256 MB: 100,000 invocations,
    # 100 s x 0.25 GB, a receive and a delete batch per invocation
    assert lambda_consumer(0.0006, 10) == pytest.approx(
        {"lambda.request": 100_000, "lambda.gb_second": 25.0, "sqs.request": 200_000})
