"""`messenger cost` on the local endpoint: messages pushed and consumed over HTTP, the endpoint's
CloudWatch metrics, and the dollars from the price table checked by hand."""

from __future__ import annotations

import json

import pytest

from messenger import (
    ChannelSpec,
    ChannelTags,
    MessageFilter,
    MultiProducer,
    Producer,
    PushItem,
)
from messenger.ops.cost import WireMeter, channel_costs
from messenger.provision import Provisioner
from messenger.tools import cli

SQS_PER_REQUEST = 0.40 / 1e6
SNS_PER_PUBLISH = 0.50 / 1e6


def test_cost_of_a_channel_from_its_metrics(settings, clients, capsys, monkeypatch):
    # Given 'orders' (owner 'payments'): 25 single pushes, received 10 at a time and deleted in
    # batches, then 2 empty receives, every request metered on the wire
    spec = ChannelSpec("orders", namespace=settings.namespace,
                       tags=ChannelTags(owner="payments", team="shop"))
    queue = Provisioner(clients, settings).ensure_channel(spec).queue
    meter = WireMeter().attach(clients)

    class Orders(Producer):
        channel = "orders"
        tags = ChannelTags(owner="payments", team="shop")

    producer = Orders(settings=settings, clients=clients)
    for n in range(25):
        producer.push({"n": n})
    sqs = clients.client("sqs")
    received = 0
    while received < 25:
        messages = sqs.receive_message(QueueUrl=queue.url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=1).get("Messages", [])
        received += len(messages)
        sqs.delete_message_batch(QueueUrl=queue.url, Entries=[
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)])
    for _ in range(2):
        assert not sqs.receive_message(QueueUrl=queue.url, WaitTimeSeconds=0).get("Messages")
    on_the_wire = sum(n for op, n in meter.requests.items() if op in (
        "sqs.SendMessage", "sqs.ReceiveMessage", "sqs.DeleteMessageBatch"))

    # When the library and the command read the day's cost
    (cost,) = channel_costs(clients, settings, "orders")
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["cost", "orders", "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)

    # Then: 25 sent, 25 received, 25 deleted, 2 empty receives; by hand, at $0.40 per million
    # requests: high = 2 + 75 requests (one message each: 77 x $0.4e-6 = $0.0000308), low =
    # 2 + 3 + 3 + 3 (batches of 10: $0.0000044); the requests sent on the wire lie between
    metrics = cost.day.metrics[queue.name]
    assert metrics == {"NumberOfMessagesSent": 25, "NumberOfMessagesReceived": 25,
                       "NumberOfMessagesDeleted": 25, "NumberOfEmptyReceives": 2}
    assert (cost.day.requests_low, cost.day.requests_high) == (11, 77)
    assert cost.day.dollars_high == pytest.approx(77 * SQS_PER_REQUEST)
    assert cost.day.dollars_low == pytest.approx(11 * SQS_PER_REQUEST)
    assert cost.day.requests_low <= on_the_wire <= cost.day.requests_high
    assert cost.month.requests_high == 77
    assert (cost.owner, cost.team, cost.kind) == ("payments", "shop", "queue")
    assert shown["day"]["dollars_high"] == pytest.approx(77 * SQS_PER_REQUEST)
    assert shown["prices_checked"] and shown["region"] == "us-east-1"

    assert cli.main(["cost", "--all"]) == 0
    table = capsys.readouterr().out
    assert "orders" in table and "payments" in table and "$0.0000044-0.0000308" in table


def test_cost_of_an_exchange_prices_its_topic_and_its_queues(settings, clients, capsys,
                                                           monkeypatch):
    # Given exchange 'shop' with two filtered queues, and 4 messages published to it
    for name, key in (("shop.audit", "A"), ("shop.mail", "M")):
        Provisioner(clients, settings).ensure_channel(ChannelSpec(
            name, namespace=settings.namespace, message_filter=MessageFilter("exact", [key])))

    class Shop(MultiProducer):
        channel = "shop"

    Shop(settings=settings, clients=clients).push_many(
        [PushItem({"n": n}, "A" if n % 2 else "M") for n in range(4)]).raise_for_failures()

    # When the exchange's cost is read
    costs = {c.channel: c for c in channel_costs(clients, settings, "shop")}

    # Then the topic (1 batch of 4 publishes: 1-4 billed) and each queue (2 deliveries each,
    # sent to it as on AWS) are priced; SNS deliveries to SQS are free
    assert set(costs) == {"shop", "shop.audit", "shop.mail"}
    topic = costs["shop"]
    assert topic.kind == "exchange"
    assert (topic.day.requests_low, topic.day.requests_high) == (1, 4)
    assert topic.day.dollars_high == pytest.approx(4 * SNS_PER_PUBLISH)
    for name in ("shop.audit", "shop.mail"):
        assert costs[name].day.requests_high == 2
        assert costs[name].day.dollars_high == pytest.approx(2 * SQS_PER_REQUEST)


def test_bad_input_is_one_line_and_exit_2(settings, clients, capsys, monkeypatch):
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    for args, said in ((["cost", "nosuch"], "no channel 'nosuch'"),
                       (["cost"], "name one channel, or --all"),
                       (["cost", "orders", "--all"], "name one channel, or --all")):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert said in err and err.strip().count("\n") == 0, err


def test_the_wire_meter_bills_what_botocore_really_passes_its_events(clients, endpoint):
    # Given real clients on the local endpoint, metered: a FIFO queue holding a 100 KiB message
    # and a table with one item (botocore's after-call event carries the call's context, not
    # its parameters: a meter reading parameters there billed every receive as standard and
    # every read as eventually consistent)
    meter = WireMeter().attach(clients)
    sqs, dynamodb = clients.client("sqs"), clients.client("dynamodb")
    url = sqs.create_queue(QueueName="metered.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x" * 100 * 1024, MessageGroupId="g")
    dynamodb.create_table(TableName="metered", BillingMode="PAY_PER_REQUEST",
                          KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    dynamodb.put_item(TableName="metered", Item={"id": {"S": "1"}})
    before = dict(meter.usage)
    # When the message is received and the item read strongly consistent
    [message] = sqs.receive_message(QueueUrl=url)["Messages"]
    dynamodb.get_item(TableName="metered", Key={"id": {"S": "1"}}, ConsistentRead=True)
    # Then the receive is billed as FIFO requests, one per started 64 KiB of its answer (at
    # least 2 for 100 KiB), and the read as one whole read unit
    added = {key: meter.usage.get(key, 0) - before.get(key, 0) for key in meter.usage}
    assert len(message["Body"]) == 100 * 1024
    assert added.get("sqs.fifo_request", 0) >= 2 and added.get("sqs.request", 0) == 0
    assert added["dynamodb.read_unit"] == 1.0
