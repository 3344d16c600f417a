"""The requeuer moves DLQ messages back to a channel without losing or altering them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from messenger import ChannelSpec, MessageFilter, PublishFailed
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE, Message
from messenger.offload import PayloadStore, pointer_attributes
from messenger.operations.requeue import Requeuer, SubscriberTypes
from messenger.produce.producer import Producer, PushItem
from messenger.provision import Provisioner
from tests.faults import Throttle
from tests.integration.helpers import decode, drain, queue_url


def dead_letter(sqs, dlq_url, messages, reason="poison"):
    """Put messages into a DLQ as a consumer forwards them (with a reason attribute)."""
    for message in messages:
        encoded = message.encode()
        attributes = {
            **encoded.attributes,
            DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason},
        }
        sqs.send_message(QueueUrl=dlq_url, MessageBody=encoded.body, MessageAttributes=attributes)


def test_requeue_moves_everything_back_unchanged(settings, clients):
    spec = ChannelSpec("orders", namespace=settings.namespace)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    sqs = clients.client("sqs")
    originals = [Message({"n": n}, f"KEY.{n % 2}", {"locale": "fr"}) for n in range(23)]
    dead_letter(sqs, resources.dlq.url, originals)
    progress = []
    report = Requeuer(
        source_queue=spec.dlq_name,
        destination_channel="orders",
        settings=settings,
        clients=clients,
        progress=lambda done, total: progress.append((done, total)),
    ).start()
    assert (report.moved, report.failed) == (23, 0)
    assert report.routing_keys == {"KEY.0": 12, "KEY.1": 11}
    assert progress[-1] == (23, 23)
    raw = drain(sqs, resources.queue.url)
    assert sorted((decode(m) for m in raw), key=lambda m: m.body["n"]) == originals
    assert not any(DEAD_LETTER_REASON_ATTRIBUTE in m.get("MessageAttributes", {}) for m in raw)
    assert drain(sqs, resources.dlq.url) == []


def test_requeue_to_an_exchange_fans_out_through_the_filters(settings, clients):
    provisioner = Provisioner(clients, settings)
    apple = provisioner.ensure_channel(
        ChannelSpec(
            "wishlist_events.apple",
            ordered=True,
            namespace=settings.namespace,
            message_filter=MessageFilter("exact", ["MOBILE.APPLE"]),
        )
    )
    everything = provisioner.ensure_channel(
        ChannelSpec("wishlist_events.everything", ordered=True, namespace=settings.namespace)
    )
    sqs = clients.client("sqs")
    for n, key in enumerate(["MOBILE.APPLE", "WEB", "MOBILE.APPLE"]):
        encoded = Message({"n": n}, key).encode()
        sqs.send_message(
            QueueUrl=apple.dlq.url,
            MessageBody=encoded.body,
            MessageAttributes=encoded.attributes,
            MessageGroupId="g",
        )
    report = Requeuer(
        apple.dlq.name,
        "wishlist_events",
        SubscriberTypes.MultiConsumer,
        settings=settings,
        clients=clients,
    ).start()
    assert report.moved == 3
    assert [decode(m).body["n"] for m in drain(sqs, apple.queue.url)] == [0, 2]
    assert [decode(m).body["n"] for m in drain(sqs, everything.queue.url)] == [0, 1, 2]


def test_dry_run_and_max_messages(settings, clients):
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace)
    )
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, [Message({"n": n}, "K") for n in range(12)])
    dry = Requeuer("orders-dlq", "orders", dry_run=True, settings=settings, clients=clients).start()
    assert (dry.moved, dry.dry_run) == (12, True)
    assert drain(sqs, resources.queue.url) == []
    partial = Requeuer(
        "orders-dlq", "orders", max_messages=5, settings=settings, clients=clients
    ).start()
    assert partial.moved == 5
    assert len(drain(sqs, resources.queue.url)) == 5
    assert len(drain(sqs, resources.dlq.url)) == 7  # the dry run released what it looked at


def test_a_failing_destination_leaves_the_messages_in_the_source(settings, clients):
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace)
    )
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, [Message({"n": n}) for n in range(4)])
    throttle = Throttle(rate=1.0, operations={"SendMessageBatch"})
    clients.register("before-send", throttle)
    with pytest.raises(PublishFailed):
        Requeuer(
            "orders-dlq",
            "orders",
            settings=settings.with_changes(retry_budget_seconds=1),
            clients=clients,
        ).start()
    clients.unregister("before-send", throttle)
    assert len(drain(sqs, resources.dlq.url)) == 4
    assert drain(sqs, resources.queue.url) == []


def test_cli_requeues_with_a_summary(settings, clients, local_endpoint):
    class Orders(Producer):
        channel = "orders"

    Orders(settings=settings, clients=clients).push_many([PushItem({"n": 1}, "A")])
    sqs = clients.client("sqs")
    main = queue_url(sqs, f"{settings.namespace}-orders")
    dlq = queue_url(sqs, f"{settings.namespace}-orders-dlq")
    for raw in drain(sqs, main):
        sqs.send_message(
            QueueUrl=dlq, MessageBody=raw["Body"], MessageAttributes=raw["MessageAttributes"]
        )
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    done = subprocess.run(
        [sys.executable, "-m", "messenger", "requeue", "orders-dlq", "orders"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"moved 1 message(s) from {settings.namespace}-orders-dlq to orders" in done.stdout
    assert [decode(m).body for m in drain(sqs, main)] == [{"n": 1}]
    missing = subprocess.run(
        [sys.executable, "-m", "messenger", "requeue", "nope-dlq", "orders"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "source queue 'nope-dlq' does not exist" in missing.stderr


def test_requeue_keeps_binary_attributes(settings, clients):
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    sqs = clients.client("sqs")
    encoded = Message({"n": 1}).encode()
    sqs.send_message(
        QueueUrl=resources.dlq.url, MessageBody=encoded.body,
        MessageAttributes={**encoded.attributes,
                           "signature": {"DataType": "Binary", "BinaryValue": b"\x00\x01sig"}},
    )
    report = Requeuer("orders-dlq", "orders", settings=settings, clients=clients).start()
    assert (report.moved, report.failed) == (1, 0)
    [raw] = drain(sqs, resources.queue.url)
    assert raw["MessageAttributes"]["signature"]["BinaryValue"] == b"\x00\x01sig"


def test_requeue_restarts_the_lifecycle_of_offloaded_payloads(settings, clients):
    # Given an offloaded message in the DLQ, its payload written long ago
    spec = ChannelSpec("orders", namespace=settings.namespace)
    provisioner = Provisioner(clients, settings)
    resources = provisioner.ensure_channel(spec)
    store = PayloadStore(clients.client("s3"), provisioner.ensure_bucket(), provisioner.key_arn())
    pointer = store.put('{"big": true}')
    s3, sqs = clients.client("s3"), clients.client("sqs")
    written = s3.head_object(Bucket=pointer.bucket, Key=pointer.key)["LastModified"]
    gone = PayloadStore(clients.client("s3"), pointer.bucket).put("{}")
    s3.delete_object(Bucket=gone.bucket, Key=gone.key)
    for item in (pointer, gone):
        sqs.send_message(QueueUrl=resources.dlq.url, MessageBody=item.encode(),
                         MessageAttributes=pointer_attributes(100))
    time.sleep(1.1)  # S3 times have one-second resolution
    # When requeued
    report = Requeuer(source_queue=spec.dlq_name, destination_channel="orders",
                      settings=settings, clients=clients).start()
    # Then both messages moved, and the payload that exists starts a new life (S3 expires
    # objects by creation date), unchanged and still under the platform key
    assert (report.moved, report.failed) == (2, 0)
    head = s3.head_object(Bucket=pointer.bucket, Key=pointer.key)
    assert head["LastModified"] > written
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["SSEKMSKeyId"] == provisioner.key_arn()
    assert store.get(pointer) == '{"big": true}'
    assert len(drain(sqs, resources.queue.url)) == 2
