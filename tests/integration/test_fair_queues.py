"""Fair queues: a standard channel's `group_id` is the tenant key SQS (and SNS standard topics)
schedule by. The local endpoint does not schedule fairly, so what is proven here is the request
the producer sends (captured on the wire by a botocore event hook) and that the key survives the
message's whole life: queue, handler, DLQ and requeue."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

import pytest

from messenger import InvalidMessage, MultiProducer, Producer, PushItem
from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec
from messenger.provision import Provisioner
from tests.integration.helpers import drain


class TenantProducer(Producer):
    channel = "reports"


class TenantExchangeProducer(MultiProducer):
    channel = "tenant_events"


class Wire:
    """The bodies of the requests a client factory's clients send, per operation."""

    def __init__(self, clients: ClientFactory) -> None:
        self.sent: list[tuple[str, Any]] = []
        clients.register("before-send", self)

    def __call__(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        operation = event_name.split(".")[2]
        body = request.body.decode() if isinstance(request.body, bytes) else request.body
        # SQS speaks JSON, SNS the query protocol: both parsed to plain data
        parsed = json.loads(body) if body.startswith("{") else {
            key: values[0] for key, values in parse_qs(body).items()}
        self.sent.append((operation, parsed))

    def of(self, operation: str) -> list[Any]:
        return [body for name, body in self.sent if name == operation]


def test_a_standard_queue_gets_each_tenant_key_as_message_group_id(settings, clients):
    # Given a standard (unordered) channel and a producer whose requests are captured
    wire = Wire(clients)
    producer = TenantProducer(settings=settings, clients=clients)
    # When one message is pushed with a tenant key and a batch mixes tenants and none
    producer.push({"n": 0}, group_id="tenant-a")
    result = producer.push_many(
        [PushItem({"n": 1}, group_id="tenant-b"), {"n": 2}, PushItem({"n": 3}, group_id="tenant-a")]
    )
    result.raise_for_failures()
    # Then SendMessage and each SendMessageBatch entry carry exactly their tenant as
    # MessageGroupId (what SQS fair queues schedule by), and never a FIFO deduplication id
    (single,) = wire.of("SendMessage")
    assert single["MessageGroupId"] == "tenant-a"
    (batch,) = wire.of("SendMessageBatch")
    assert [entry.get("MessageGroupId") for entry in batch["Entries"]] == [
        "tenant-b", None, "tenant-a"]
    assert not any("MessageDeduplicationId" in body for body in [single, *batch["Entries"]])
    # And the queue (standard, no FIFO) holds them with their tenant
    url = clients.client("sqs").get_queue_url(QueueName=f"{settings.namespace}-reports")
    got = drain(clients.client("sqs"), url["QueueUrl"])
    tenants = {json.loads(m["Body"])["n"]: m["Attributes"].get("MessageGroupId") for m in got}
    assert tenants == {0: "tenant-a", 1: "tenant-b", 2: None, 3: "tenant-a"}


def test_a_standard_exchange_publishes_the_tenant_key_to_its_queues(settings, clients):
    # Given a standard exchange with one consumer queue
    provisioner = Provisioner(clients, settings)
    queue = provisioner.ensure_channel(
        ChannelSpec("tenant_events.audit", namespace=settings.namespace)).queue
    wire = Wire(clients)
    producer = TenantExchangeProducer(settings=settings, clients=clients)
    # When a push and a batch name tenants
    producer.push({"n": 0}, group_id="tenant-a")
    producer.push_many([PushItem({"n": 1}, group_id="tenant-b"), {"n": 2}]).raise_for_failures()
    # Then Publish and PublishBatch carry them (SNS forwards them to standard SQS subscriptions)
    assert wire.of("Publish")[0]["MessageGroupId"] == "tenant-a"
    (batch,) = wire.of("PublishBatch")
    entries = "PublishBatchRequestEntries.member"
    assert batch[f"{entries}.1.MessageGroupId"] == "tenant-b"
    assert f"{entries}.2.MessageGroupId" not in batch
    got = drain(clients.client("sqs"), queue.url)
    assert {json.loads(m["Body"])["n"] for m in got} == {0, 1, 2}


def test_a_class_tenant_applies_to_every_push_and_a_push_overrides_it(settings, clients):
    class NightlyReports(TenantProducer):
        group_id = "nightly-batch"  # the whole producer is one tenant of a shared queue

    wire = Wire(clients)
    producer = NightlyReports(settings=settings, clients=clients)
    producer.push({"n": 0})
    producer.push({"n": 1}, group_id="urgent")
    assert [body["MessageGroupId"] for body in wire.of("SendMessage")] == [
        "nightly-batch", "urgent"]


def test_standard_channels_still_refuse_fifo_dedup_ids_and_bad_tenant_keys(settings, clients):
    producer = TenantProducer(settings=settings, clients=clients)
    with pytest.raises(InvalidMessage, match="dedup_id applies to ordered channels only"):
        producer.push({"n": 1}, group_id="tenant-a", dedup_id="d1")
    # A key SQS would refuse fails its own item, never the batch it travels in
    result = producer.push_many(
        [PushItem({"n": 0}, group_id="tenant a"), PushItem({"n": 1}, group_id="tenant-a")])
    assert [(f.index, f.code) for f in result.failures] == [(0, "InvalidMessage")]
    assert "group_id must be 1 to 128" in result.failures[0].reason
    assert result.message_ids[1] is not None
